"""User model code inside its child process: load the entrypoint from the job's code folder, and
describe what went wrong in it by the user's own frames (never the service's).

Framework-free: the trainers call `UserModel.build` and `UserModel.loss` with their own tensors.
"""

from __future__ import annotations

import importlib
import math
import sys
import traceback
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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


def shared_init(shapes: Mapping[str, tuple[int, ...]], seed: int) -> dict[str, np.ndarray]:
    """Framework-neutral initial values for parameters named and shaped as PyTorch's (`hidden.weight`
    [out, in], ...), each a function of (seed, name, shape) only, so a JAX and a PyTorch module that
    name their parameters alike start from the same weights (a comparison's `init: "shared"`).

    PyTorch's defaults for nn.Linear and nn.ConvNd: a weight of 2+ dimensions ~ U(-b, b) with
    b = 1/sqrt(fan_in), fan_in = prod(shape[1:]); its bias (`<prefix>.bias`) the same bound; a
    1-D `weight` with no such sibling (a norm's scale) ones, and any other 1-D tensor zeros;
    `running_var` ones, `running_mean` zeros."""
    values: dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        prefix, _, leaf = name.rpartition(".")
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        sibling = shapes.get(f"{prefix}.weight" if prefix else "weight", ())
        if len(shape) >= 2:
            bound = 1.0 / math.sqrt(max(1, math.prod(shape[1:])))
        elif leaf == "bias" and len(sibling) >= 2:
            bound = 1.0 / math.sqrt(max(1, math.prod(sibling[1:])))
        else:
            fill = 1.0 if leaf in ("weight", "running_var") else 0.0
            values[name] = np.full(shape, fill, np.float32)
            continue
        values[name] = rng.uniform(-bound, bound, size=shape).astype(np.float32)
    return values
