"""The embedded stack: the API (uvicorn) and one cpu worker as child processes of `trainhub up`.

SQLite and kombu's filesystem transport live under the var dir, so nothing else is needed.
Children are started by module name, so app/ never imports workers/.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Stack:
    """Child processes started together and stopped together."""

    url: str
    processes: list[subprocess.Popen] = field(default_factory=list)

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until /readyz answers 200. Raises RuntimeError if a child exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{' '.join(process.args[:4])} exited with code {process.returncode}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(f"the API at {self.url} was not ready after {timeout_s} s")

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM every child (a worker finishes its current step), then SIGKILL stragglers."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in self.processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# Settings that would point the embedded stack at outside services; `up` is always self-contained.
EXTERNAL_SERVICES = ("TRAINHUB_DATABASE_URL", "TRAINHUB_BROKER_URL", "TRAINHUB_ARTIFACT_DIR", "TRAINHUB_ARTIFACT_STORE")


def embedded_env(var_dir: Path) -> dict[str, str]:
    """The environment of the children: everything under `var_dir`, made absolute."""
    env = {k: v for k, v in os.environ.items() if k not in EXTERNAL_SERVICES}
    env["TRAINHUB_VAR_DIR"] = str(var_dir.resolve())
    return env


def start(var_dir: Path, host: str, port: int, workers: int = 1, cpu_devices: int = 1) -> Stack:
    """Start the API and `workers` cpu workers (each counting as `cpu_devices` devices), logging
    to `<var_dir>/logs/`; the caller waits for readiness and stops them."""
    env = embedded_env(var_dir)
    logs = var_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    stack = Stack(url=f"http://{host}:{port}")
    commands = {"api": [sys.executable, "-m", "uvicorn", "app.main:app", "--host", host, "--port", str(port)]}
    for i in range(workers):
        commands[f"worker-{i}"] = [sys.executable, "-m", "workers", "--hardware", "cpu",
                                   "--cpu-devices", str(cpu_devices)]
    for name, command in commands.items():
        with open(logs / f"{name}.log", "ab") as log:  # the child keeps its own copy of the fd
            stack.processes.append(subprocess.Popen(
                command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent))
    return stack


def _die_with_parent() -> None:
    """In the child: get SIGTERM when `trainhub up` dies, even by SIGKILL (Linux prctl)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1
