"""User model code inside its child process: load the entrypoint from the job's code folder, and
describe what went wrong in it by the user's own frames (never the service's).

Framework-free: the trainers call `UserModel.build` and `UserModel.loss` with their own tensors.
"""

from __future__ import annotations

import importlib
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_FRAMES = 20
MAX_MESSAGE_CHARS = 2000


@dataclass(frozen=True)
class UserModel:
    """The entrypoint `build(input_shape, num_classes, **kwargs)` of the job's code and its module's
    optional `loss(logits, targets)` (None: the task's loss)."""

    build_fn: Callable[..., Any]
    kwargs: dict[str, Any] = field(default_factory=dict)
    loss: Callable[[Any, Any], Any] | None = None

    def build(self, input_shape: tuple[int, ...], num_classes: int) -> Any:
        return self.build_fn(tuple(input_shape), num_classes, **self.kwargs)


def load(code_dir: Path, entrypoint: str, kwargs: dict[str, Any] | None) -> UserModel:
    """Import `module:function` from `code_dir` (put first on sys.path); its module's `loss`, when
    it has a callable one, replaces the task's loss."""
    module_name, function = entrypoint.split(":", 1)
    sys.path.insert(0, str(code_dir))
    module = importlib.import_module(module_name)
    build_fn = getattr(module, function)
    loss = getattr(module, "loss", None)
    return UserModel(build_fn=build_fn, kwargs=dict(kwargs or {}), loss=loss if callable(loss) else None)


def describe(exc: BaseException, code_dir: Path) -> dict[str, str]:
    """{"exception": its type's name, "message": "Type: message", "traceback": the frames in the
    user's files only (paths relative to the code folder), innermost last}."""
    root = str(code_dir.resolve()) + "/"
    frames = [
        f'  File "{frame.filename[len(root) :]}", line {frame.lineno}, in {frame.name}\n'
        f"    {(frame.line or '').strip()}"
        for frame in traceback.extract_tb(exc.__traceback__)
        if frame.filename.startswith(root)
    ][-MAX_FRAMES:]
    message = f"{type(exc).__name__}: {exc}"[:MAX_MESSAGE_CHARS]
    return {"exception": type(exc).__name__, "message": message, "traceback": "\n".join(frames)}
