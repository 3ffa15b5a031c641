"""Run a user-code job: the trainer in a child process behind workers/sandbox.py's walls, talking
to this worker only over a pipe.

The worker hands the child this job's code (written into its working directory) and data (an
uploaded dataset's cached file, copied in), then reads JSON lines: epoch metrics it checks
(known names, finite numbers) and records through the job's hooks, and a result naming the
artifacts it wrote, which the worker checks (known names, plain files in the job's folder,
sizes) before they are stored. Cancel, max_runtime_s, shutdown and preemption kill the child's
whole process group, and the job's end kills all that is left in its pids cgroup (where the host has
one: workers/cgroup.py), daemons too. Its stdout and stderr become `logs.txt` (the first LOG_BYTES).
"""

from __future__ import annotations

import json
import logging
import math
import os
import select
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any, BinaryIO

from sqlalchemy.exc import SQLAlchemyError

from app import storage
from app.code.package import _checked_name
from app.config import get_settings
from app.db import session_scope
from app.models import CodeUpload, JobLog
from trainers.base import CHECKPOINT_DIR, CHECKPOINT_FILE, METRIC_FIELDS, EpochMetrics, FitResult
from trainers.spec import JobSpec
from workers import cgroup, sandbox

log = logging.getLogger(__name__)

LOG_FILE = "logs.txt"
LOG_BYTES = 1 << 20  # of the child's stdout and stderr kept in logs.txt
MAX_LINE_BYTES = 1 << 20  # one JSON line from the child
CODE_FOLDER, DATA_FOLDER = ".code", ".data"
# The artifacts a child may hand back (trainers' own names), each checked before it is stored.
ARTIFACT_NAMES = (
    "weights.safetensors",
    "state_dict.pt",
    "params.msgpack",
    "metrics.json",
    "spec.json",
    "preprocessing.json",
)
LOG_EVENT_BYTES = 256 * 1024  # of the child's output streamed as `log` events (logs.txt keeps more)
LOG_LINE_CHARS = 4000  # a longer line is streamed in pieces of this many characters
LOG_FLUSH_S = 1.0  # the worker stores the lines read at most this often (one row each time)
# What stays in a user-code job's folder after its child ends: the artifacts, logs.txt and the
# trainers' checkpoints (a job handed back resumes from them; a JAX job's is CHECKPOINT_DIR). All
# else the child wrote goes.
KEPT_NAMES = {*ARTIFACT_NAMES, LOG_FILE, CHECKPOINT_FILE}
DISK_CHECK_S = 1.0  # how often the worker adds up the folder while the child runs
MAX_FOLDER_ENTRIES = 10_000  # files and folders a child may make in its job's folder
START_SLACK_CPU_S = 120  # CPU seconds of the child's start (imports, data) on top of max_runtime_s
# The child's processes and threads (its pids cgroup counts both): XLA and torch start about 4
# threads per core of their own (a JAX job on 2 cores: 18), so the limit grows with the cores.
PROCESSES, PROCESSES_PER_CORE = 64, 8


class UserCodeFailed(Exception):
    """The user's code raised, or its child process died (a limit, a signal) or broke the protocol:
    the job fails `user_code_error` with this message (the exception, the user's frames)."""


class _Drain(threading.Thread):
    """Read the child's stdout+stderr to its end, keeping the first LOG_BYTES, and its whole lines
    (the first LOG_EVENT_BYTES, each cut at LOG_LINE_CHARS) for `take_lines`."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(daemon=True)
        self.stream, self.kept, self.dropped = stream, bytearray(), 0
        self.lock, self.streamed = threading.Lock(), 0
        self.lines: list[str] = []
        self.partial = b""

    def run(self) -> None:
        # os.read returns what is there: the buffered read(n) would wait for n bytes or the end.
        while chunk := os.read(self.stream.fileno(), 65536):
            room = LOG_BYTES - len(self.kept)
            self.kept += chunk[:room]
            self.dropped += max(0, len(chunk) - room)
            self._split(chunk)
        self._split(b"\n" if self.partial else b"")

    def _split(self, chunk: bytes) -> None:
        *whole, self.partial = (self.partial + chunk).split(b"\n")
        if len(self.partial) > LOG_LINE_CHARS:  # a line without end: sent in pieces
            whole, self.partial = [*whole, self.partial], b""
        with self.lock:
            for line in whole:
                if self.streamed >= LOG_EVENT_BYTES:
                    return
                text = line.decode(errors="replace")[:LOG_LINE_CHARS]
                self.lines.append(text)
                self.streamed += len(text) + 1

    def take_lines(self) -> list[str]:
        """The whole lines read since the last call."""
        with self.lock:
            lines, self.lines = self.lines, []
        return lines

    def text(self) -> bytes:
        tail = f"\n[trainhub: {self.dropped:,} more bytes of output were dropped]\n" if self.dropped else ""
        return bytes(self.kept) + tail.encode()


def fit(job_id: str, spec: JobSpec, workdir: Path, hooks: Any, dataset_file: Path | None) -> FitResult:
    """Train the user-code job `spec` in a sandboxed child process (see the module docstring);
    `hooks` are the job's runner.JobHooks. Raises UserCodeFailed, StopTraining from the hooks
    (after the child is killed), or the trainers' own errors the child reports (NanLoss...)."""
    settings = get_settings()
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "tmp").mkdir(exist_ok=True)
    code_dir = _write_code(spec, workdir / CODE_FOLDER)
    data = _copy_data(dataset_file, workdir / DATA_FOLDER)
    threads = len(os.sched_getaffinity(0))
    cpu_s = int(math.ceil(spec.max_runtime_s * threads)) + START_SLACK_CPU_S if spec.max_runtime_s else None
    processes = PROCESSES + PROCESSES_PER_CORE * threads
    limits = sandbox.Limits(settings.user_code_memory_bytes, settings.user_code_file_bytes, processes, cpu_s)
    extra = [p for p in (settings.data_dir,) if p is not None and p.exists()]
    readable = sandbox.readable_roots(extra)
    log.info("job %s: user code runs in a child with %s", job_id, sandbox.available())
    group = cgroup.JobCgroup.create(job_id, limits.processes)
    try:
        setup = sandbox.preexec(workdir, limits, readable, group)
        return _run(job_id, spec, workdir, hooks, code_dir, data, threads, setup)
    except UserCodeFailed as error:
        if group is not None and group.reached_limit():  # e.g. a fork bomb's BlockingIOError
            raise UserCodeFailed(f"it reached its limit of {limits.processes} processes and threads; {error}") from None
        raise
    finally:
        if group is not None:  # what it left behind, daemons too, dies with the job
            peak = group.destroy()
            log.info("job %s: its pids cgroup held at most %s of %d tasks", job_id, peak, limits.processes)
        _clean_folder(workdir, spec.framework)  # once nothing of the child's can write there any more


def _run(
    job_id: str,
    spec: JobSpec,
    workdir: Path,
    hooks: Any,
    code_dir: Path,
    data: Path | None,
    threads: int,
    preexec: Callable[[], None],
) -> FitResult:
    """Start the child (`preexec` sets up its walls), follow it to its result, kill its process
    group, keep its output."""
    settings = get_settings()
    read_end, write_end = os.pipe()
    request = {
        "fd": write_end,
        "spec": spec.model_dump(mode="json"),
        "workdir": str(workdir),
        "code_dir": str(code_dir),
        "data_dir": str(settings.data_dir) if settings.data_dir else None,
        "dataset_file": str(data) if data else None,
    }
    # The worker's device pinning goes on: the child trains on the worker's devices only (and a
    # cpu worker counted as N devices gives JAX N host devices: XLA_FLAGS).
    pinning = ("CUDA_VISIBLE_DEVICES", "TPU_VISIBLE_CHIPS", "XLA_FLAGS")
    extra_env = {k: os.environ[k] for k in pinning if k in os.environ}
    try:
        child = subprocess.Popen(
            # -I: no PYTHON* variables, no user site; -u: its prints reach the worker (and the `log`
            # events) as they happen, and are not lost in a buffer if it dies
            [sys.executable, "-I", "-u", "-m", "trainers.user_child", json.dumps(request)],
            cwd=workdir,
            env=sandbox.clean_env(workdir, threads, extra_env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(write_end,),
            preexec_fn=preexec,
            start_new_session=True,  # its own process group: killed as one
        )
    finally:
        os.close(write_end)
    assert child.stdout is not None
    drain = _Drain(child.stdout)
    drain.start()
    done = False
    try:
        logs = partial(_store_lines, job_id, drain)
        # The job's code and data copies (the worker's) are allowed on top of the limit; all the
        # folder holds counts, so writing into their folders does not escape it.
        copied = sum(p.stat().st_size for p in code_dir.rglob("*") if p.is_file()) + (
            data.stat().st_size if data else 0
        )
        disk = partial(_check_folder, workdir, settings.user_code_disk_bytes + copied)
        result = _follow(child, os.fdopen(read_end, "rb"), hooks, workdir, settings.user_code_file_bytes, logs, disk)
        done = True
        return result
    finally:
        _kill(child, done)
        drain.join(timeout=10)
        _store_lines(job_id, drain)  # the last lines, stored before the job's end
        (workdir / LOG_FILE).write_bytes(drain.text())
        log.info("job %s: user code's child %d ended with %s", job_id, child.pid, child.returncode)


def _store_lines(job_id: str, drain: _Drain) -> None:
    """Store the lines the child printed since the last call as one job_logs row (its streams send
    it as a `log` event). Only a hint: a database error loses these lines from the stream, not
    from logs.txt, and never fails the job."""
    lines = drain.take_lines()
    if not lines:
        return
    try:
        with session_scope() as session:
            session.add(JobLog(job_id=job_id, text="\n".join(lines) + "\n"))
            session.commit()
    except SQLAlchemyError as error:
        log.warning("job %s: %d lines of its output were not streamed: %s", job_id, len(lines), type(error).__name__)


def _follow(
    child: subprocess.Popen,
    channel: BinaryIO,
    hooks: Any,
    workdir: Path,
    max_file_bytes: int,
    store_lines: Callable[[], None] = lambda: None,
    check_folder: Callable[[], None] = lambda: None,
) -> FitResult:
    """Read the child's messages until its result; between them, let the hooks stop the run, store
    what it printed (`store_lines`, every LOG_FLUSH_S) and check its folder (`check_folder`, every
    DISK_CHECK_S)."""
    metrics: list[EpochMetrics] = []
    next_flush = next_check = time.monotonic()
    with channel:
        while True:
            ready, _, _ = select.select([channel], [], [], 0.25)
            hooks.should_stop()
            if time.monotonic() >= next_flush:
                store_lines()
                next_flush = time.monotonic() + LOG_FLUSH_S
            if time.monotonic() >= next_check:
                check_folder()
                next_check = time.monotonic() + DISK_CHECK_S
            if not ready:
                continue
            line = channel.readline(MAX_LINE_BYTES)
            if not line:
                raise UserCodeFailed(_died(child))
            message = _parse(line)
            kind = message.get("type")
            if kind == "epoch":
                epoch_metrics = _epoch(message, len(metrics))
                metrics.append(epoch_metrics)
                hooks.report(epoch_metrics.epoch, epoch_metrics)
            elif kind == "error":
                raise _error(message)
            elif kind == "result":
                return _result(message, metrics, workdir, max_file_bytes)
            else:
                raise UserCodeFailed(f"the child process sent an unknown message type {str(kind)[:40]!r}")


def _check_folder(workdir: Path, max_bytes: int) -> None:
    """UserCodeFailed when the job's folder holds more than `max_bytes` (TRAINHUB_USER_CODE_DISK_BYTES
    plus the job's code and data copies) or MAX_FOLDER_ENTRIES files and folders."""
    total, entries = 0, 0
    pending = list(os.scandir(workdir))
    while pending:
        entry = pending.pop()
        entries += 1
        if entries > MAX_FOLDER_ENTRIES:
            raise UserCodeFailed(f"it made more than {MAX_FOLDER_ENTRIES:,} files and folders in its job's folder")
        try:
            if entry.is_dir(follow_symlinks=False):
                pending.extend(os.scandir(entry.path))
            else:
                total += entry.stat(follow_symlinks=False).st_size
        except FileNotFoundError:  # removed by the child meanwhile
            continue
        if total > max_bytes:
            raise UserCodeFailed(
                f"its files in the job's folder passed the limit of {max_bytes:,} bytes (TRAINHUB_USER_CODE_DISK_BYTES)"
            )


def _clean_folder(workdir: Path, framework: str) -> None:
    """Remove what the child left in the job's folder but KEPT_NAMES (its artifacts, logs and the
    trainers' checkpoints) as the trainers write them: plain files, and for a JAX job the folder of
    Orbax's checkpoints (kept as written: within the folder's byte limit while it ran). Gone: files it
    wrote, its temp folder and caches, the job's code and data copies."""
    for entry in os.scandir(workdir):
        if entry.name == CHECKPOINT_DIR and framework == "jax" and entry.is_dir(follow_symlinks=False):
            continue
        if entry.name in KEPT_NAMES and entry.is_file(follow_symlinks=False):
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            Path(entry.path).unlink(missing_ok=True)


def _parse(line: bytes) -> dict[str, Any]:
    try:
        message = json.loads(line)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        raise UserCodeFailed("the child process sent a line that is not a JSON object (its pipe is the worker's)")
    return message


def _finite(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UserCodeFailed(f"{what} is {str(value)[:40]}, not a finite number")
    return float(value)


def _timing(name: object, value: Any) -> float | int:
    """A timing the child sent: seconds (a float), or `compilations`, a count (an int)."""
    checked = _finite(value, f"timing {name}")
    return int(value) if name == "compilations" and isinstance(value, int) else checked


def _epoch(message: dict[str, Any], done: int) -> EpochMetrics:
    values = message.get("metrics")
    if not isinstance(values, dict) or set(values) - set(METRIC_FIELDS) or message.get("epoch") != done + 1:
        raise UserCodeFailed(f"the child process sent malformed metrics for epoch {done + 1}")
    checked = {
        name: (None if value is None else _finite(value, f"metric {name}"))
        for name, value in values.items()
        if name != "epoch"
    }
    return EpochMetrics(epoch=done + 1, **checked)  # type: ignore[arg-type]  # required fields checked by the dataclass


OWN_ERRORS = ("DataNotFound", "DatasetCorrupt", "HardwareMismatch", "NanLoss")


def _error(message: dict[str, Any]) -> Exception:
    text = str(message.get("message", ""))[:4000]
    frames = str(message.get("traceback", ""))[:8000]
    if message.get("kind") in OWN_ERRORS:  # the trainers' own errors keep their types
        return _own_error(str(message["kind"]), text.split(": ", 1)[-1])
    where = f"\nTraceback (your code, most recent call last):\n{frames}" if frames else ""
    return UserCodeFailed(f"{text}{where}")


def _own_error(kind: str, text: str) -> Exception:
    """An exception whose class name is `kind`, so app.failures.classify types it as the trainers would."""
    return type(kind, (Exception,), {})(text)


def _result(message: dict[str, Any], metrics: list[EpochMetrics], workdir: Path, max_file_bytes: int) -> FitResult:
    names = message.get("artifacts")
    if not isinstance(names, list) or not metrics:
        raise UserCodeFailed("the child process ended without metrics or artifacts")
    for name in names:
        if name not in ARTIFACT_NAMES:
            raise UserCodeFailed(f"the child process named an artifact {str(name)[:60]!r} that jobs do not have")
        info = (workdir / name).lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_file_bytes:
            raise UserCodeFailed(f"artifact {name} is not a plain file of at most {max_file_bytes:,} bytes")
    timings = {str(k): _timing(k, v) for k, v in dict(message.get("timings") or {}).items()}
    result = {str(k): _finite(v, f"result {k}") for k, v in dict(message.get("result") or {}).items()}
    device = message.get("device")
    device = device if isinstance(device, dict) else {}
    return FitResult(metrics=metrics, timings=timings, result=result, artifacts=[*names, LOG_FILE], device=device)


SIGNALS = {
    signal.SIGXCPU: "it used up its CPU time (RLIMIT_CPU, from max_runtime_s)",
    signal.SIGXFSZ: "it wrote a file past the limit (RLIMIT_FSIZE, TRAINHUB_USER_CODE_FILE_BYTES)",
    signal.SIGKILL: "it was killed (out of memory, or by the host)",
    signal.SIGSEGV: "it crashed (segmentation fault)",
}


def _died(child: subprocess.Popen) -> str:
    try:
        code = child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        return "the child process closed its pipe to the worker without a result"
    if code < 0:
        why = SIGNALS.get(signal.Signals(-code), f"it was stopped by {signal.Signals(-code).name}")
        return f"the job's child process ended before its result: {why}; see logs.txt"
    return f"the job's child process exited with status {code} before its result; see logs.txt"


def _kill(child: subprocess.Popen, done: bool) -> None:
    """End the child and every process it started (its process group), and reap it; a child that
    sent its result (`done`) gets a few seconds to exit on its own first."""
    if done:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    try:  # its own children may live on in the group even after it exited
        os.killpg(child.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    child.wait()


def _write_code(spec: JobSpec, folder: Path) -> Path:
    """The job's code, read from the store, written (each name checked again) into `folder`."""
    with session_scope() as session:
        row = session.get(CodeUpload, spec.model.code)
        if row is None:
            raise UserCodeFailed(f"code {spec.model.code} was deleted before the job ran: upload it again")
        location = row.location
    files = json.loads(storage.read_bytes(location))
    shutil.rmtree(folder, ignore_errors=True)
    for name, text in files.items():
        path = folder / _checked_name(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


def _copy_data(dataset_file: Path | None, folder: Path) -> Path | None:
    """The uploaded dataset's cached file, copied into the job's folder: the child reads no other."""
    if dataset_file is None:
        return None
    folder.mkdir(exist_ok=True)
    target = folder / "dataset.safetensors"
    shutil.copyfile(dataset_file, target)
    return target
