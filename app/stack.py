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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx


def port_in_use(host: str, port: int) -> bool:
    """Whether something already listens on host:port (then a new API there would fail to bind,
    and readiness checks would reach the other server)."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# A child that exits within this many seconds of its start failed to start; after this many such
# exits in a row, `up` gives up instead of restarting it again.
FAILED_START_S = 10.0
MAX_FAILED_STARTS = 3
# Waits before restarting a child that died: doubled each time it fails to start, up to the cap.
RESTART_BACKOFF_S = 1.0
MAX_RESTART_BACKOFF_S = 30.0


class ChildKeepsFailing(RuntimeError):
    """A child exited MAX_FAILED_STARTS times in a row within FAILED_START_S of its start."""


@dataclass
class Child:
    """How to (re)start one child of the stack: its name (api, worker-0...), command and log."""

    name: str
    command: list[str]
    env: dict[str, str]
    log_path: Path
    started_at: float = 0.0
    failed_starts: int = 0
    restart_at: float | None = None

    def start(self) -> subprocess.Popen:
        self.started_at = time.monotonic()
        with open(self.log_path, "ab") as log:  # the child keeps its own copy of the fd
            return subprocess.Popen(
                self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
            )


@dataclass
class Stack:
    """Child processes started together and stopped together; `supervise` restarts one that died."""

    url: str
    processes: list[subprocess.Popen] = field(default_factory=list)
    children: list[Child] = field(default_factory=list)  # processes[i] runs children[i]

    def supervise(self, say: Callable[[str], object] = print) -> None:
        """Restart each child that exited, after a short backoff, saying so with `say(line)`.
        Raises ChildKeepsFailing when one fails at start MAX_FAILED_STARTS times in a row."""
        now = time.monotonic()
        for i, child in enumerate(self.children):
            process = self.processes[i]
            if process.poll() is None:
                continue
            if child.restart_at is None:
                quick = now - child.started_at < FAILED_START_S
                child.failed_starts = child.failed_starts + 1 if quick else 0
                if child.failed_starts >= MAX_FAILED_STARTS:
                    raise ChildKeepsFailing(
                        f"{child.name} exited with code {process.returncode} {child.failed_starts} "
                        f"times within {FAILED_START_S:.0f} s of its start; see {child.log_path}"
                    )
                delay = min(MAX_RESTART_BACKOFF_S, RESTART_BACKOFF_S * 2**child.failed_starts)
                child.restart_at = now + delay
                say(
                    f"{child.name} exited with code {process.returncode}; restarting it in {delay:.0f} s "
                    f"(log: {child.log_path})"
                )
            elif now >= child.restart_at:
                child.restart_at = None
                self.processes[i] = child.start()
                say(f"{child.name} restarted (pid {self.processes[i].pid})")

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Wait until /readyz answers 200. Raises RuntimeError if a child exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for process in self.processes:
                if process.poll() is not None:
                    raise RuntimeError(f"{' '.join(map(str, process.args[:4]))} exited with code {process.returncode}")  # type: ignore[index]
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
    commands = {
        # `trainhub serve`, as in production: the same Settings (shutdown_timeout_s...) apply.
        "api": [sys.executable, "-m", "app.cli", "serve", "--host", host, "--port", str(port)]
    }
    for i in range(workers):
        commands[f"worker-{i}"] = [
            sys.executable,
            "-m",
            "workers",
            "--hardware",
            "cpu",
            "--cpu-devices",
            str(cpu_devices),
        ]
    for name, command in commands.items():
        child = Child(name, command, env, logs / f"{name}.log")
        stack.children.append(child)
        stack.processes.append(child.start())
    return stack


def _die_with_parent() -> None:
    """In the child: get SIGTERM when `trainhub up` dies, even by SIGKILL (Linux prctl)."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


PR_SET_PDEATHSIG = 1
