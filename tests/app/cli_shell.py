"""A user's shell for CLI tests: the API served by uvicorn on PostgreSQL (no worker), a new key,
and `trainhub` run as a subprocess the way a user types it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app.stack import Stack, free_port


def trainhub(env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`trainhub *args` in a shell with `env`; killed after `timeout` seconds (a command that
    waits, such as `--wait --timeout N`, needs more than its own N)."""
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@contextmanager
def user_shell(
    database_url: str, redis_url: str, root: Path, name: str, key_options: tuple[str, ...] = (), **extra: str
) -> Iterator[dict[str, str]]:
    """The environment of a shell with TRAINHUB_API_URL and a new TRAINHUB_API_KEY (named
    `name`, made with `keys create` and `key_options`), the API running until the block ends;
    `extra` are more environment variables."""
    env = {
        **os.environ,
        "TRAINHUB_DATABASE_URL": database_url,
        "TRAINHUB_BROKER_URL": redis_url,
        "TRAINHUB_ARTIFACT_DIR": str(root / "artifacts"),
        "TRAINHUB_VAR_DIR": str(root / "var"),
        **extra,
    }
    port = free_port()
    stack = Stack(url=f"http://127.0.0.1:{port}")
    stack.processes.append(
        subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port), "--log-level", "warning"], env=env
        )
    )
    try:
        stack.wait_ready()
        created = trainhub(env, "keys", "create", "--name", name, *key_options)
        assert created.returncode == 0, created.stdout + created.stderr
        yield {**env, "TRAINHUB_API_URL": stack.url, "TRAINHUB_API_KEY": created.stdout.strip().splitlines()[-1]}
    finally:
        stack.stop()
