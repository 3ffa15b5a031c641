"""The cold-start row (issue 23): how soon a fresh `trainhub worker` is online, and how soon the
first job on it reports its first epoch, with the compilation caches warm from an earlier worker.

The service's own worker first runs one job of each kind (jax, pytorch, pytorch+compile), which
fills JAX's persistent compilation cache and Inductor's FX graph cache (both under the service's
root, shared by every worker it starts; `--quick` keeps Inductor's in the machine's cache), and
is then stopped. Then, for each kind in turn:

- a fresh `python -m workers --hardware cpu` is started; online_s runs from just before its
  process is spawned to the moment its heartbeat row is in GET /workers;
- one job of that kind is submitted as soon as it is online; first_epoch_s runs from the POST to
  the job's first epoch being stored (its `epoch` column), polled every 20 ms, and is held
  against that epoch's own epoch_time_s (its train time);
- the framework it did not need must not be loaded: the other one's shared library is looked
  for in /proc/<pid>/maps once the job has ended;
- the worker is stopped (SIGTERM) before the next kind's starts, so each job is its worker's first.

The "warm-up" kinds do the same with TRAINHUB_WARM_UP naming the job's framework: the worker
imports it in the background from the moment it is online (workers/warm_up.py).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from bench.procs import die_with_parent
from bench.service import Service, _parse_time, run_job

# (label, framework, compile) of the first jobs; each one's spec is small_jobs' digits MLP.
KINDS = (("jax", "jax", False), ("pytorch", "pytorch", False), ("pytorch+compile", "pytorch", True))
# The same first jobs on a worker that warms their framework up (TRAINHUB_WARM_UP).
WARM_KINDS = (("jax, warm-up", "jax", False), ("pytorch, warm-up", "pytorch", False))
# A shared object each framework's import maps: seeing it in the other kind's worker means the
# worker imported what its first job did not need.
LIBRARY = {"jax": "xla_extension", "pytorch": "libtorch_cpu"}
FINAL = ("succeeded", "failed", "cancelled")


def first_spec(framework: str, compile: bool) -> dict:
    from bench.small_jobs import small_spec

    spec = small_spec(framework, label="cold-start")
    if compile:
        spec["compile"] = True
    return spec


def measure(service: Service, log: Callable[[str], None] = print, timeout_s: float = 300.0) -> dict:
    """{"kinds": {label: figures}}; raises RuntimeError when a worker does not start or a job fails."""
    with service.client() as client:
        log("cold start: one job of each kind on the service's worker, to warm both compilation caches")
        for label, framework, compile in KINDS:
            job = run_job(client, first_spec(framework, compile))
            if job["status"] != "succeeded":
                raise RuntimeError(f"the warming {label} job ended {job['status']}: {job['error']}")
        stop(service.worker)
        service.worker = None  # stop() of the service must not wait on it again
        kinds = {}
        for label, framework, compile in (*KINDS, *WARM_KINDS):
            log(f"cold start: a fresh worker, then its first job ({label})")
            warm = framework if "warm-up" in label else ""
            kinds[label] = fresh_worker_first_job(service, client, framework, compile, timeout_s, warm)
            figures = kinds[label]
            log(f"  online {figures['online_s']:.2f} s; first epoch {figures['first_epoch_s']:.2f} s after "
                f"submit (its train time {figures['epoch_time_s']:.3f} s)")
    return {"kinds": kinds}


def fresh_worker_first_job(service: Service, client: httpx.Client, framework: str, compile: bool,
                           timeout_s: float, warm_up: str = "") -> dict:
    name = f"{framework}{'-compile' if compile else ''}{'-warm-up' if warm_up else ''}"
    log_path = service.root / "logs" / f"worker-cold-{name}.log"
    started = time.perf_counter()
    env = {**service.env, "TRAINHUB_WARM_UP": warm_up}
    worker = subprocess.Popen([sys.executable, "-m", "workers", "--hardware", "cpu"], env=env,
                              stdout=open(log_path, "ab"), stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
    try:
        online_s = wait_online(client, worker, started, log_path, timeout_s)
        sent = time.perf_counter()
        response = client.post("/jobs", json=first_spec(framework, compile))
        response.raise_for_status()
        job_id = response.json()["id"]
        first_epoch_s = wait_first_epoch(service, job_id, sent, timeout_s)
        job = wait_done(client, job_id, timeout_s)
        if job["status"] != "succeeded":
            raise RuntimeError(f"the first {framework} job on a fresh worker ended {job['status']}: {job.get('error')}")
        epoch = client.get(f"/jobs/{job_id}/metrics").json()
        epoch = (epoch["items"] if isinstance(epoch, dict) else epoch)[0]
        other = next(f for f in LIBRARY if f != framework)
        return {
            "online_s": online_s,
            "first_epoch_s": first_epoch_s,
            "epoch_time_s": epoch["epoch_time_s"],
            "eval_time_s": epoch["eval_time_s"],
            "beyond_train_s": first_epoch_s - epoch["epoch_time_s"],
            "timings": job["timings"],
            "other_framework_loaded": loaded(worker.pid, LIBRARY[other]),
            "own_framework_loaded": loaded(worker.pid, LIBRARY[framework]),
            "log": str(log_path),
        }
    finally:
        stop(worker)


def wait_online(client: httpx.Client, worker: subprocess.Popen, started: float, log_path: Path,
                timeout_s: float) -> float:
    """Seconds from `started` until GET /workers lists a worker online that started after it (the
    bench's key sees other workers' names only as aliases; the earlier ones are stopped)."""
    spawned = time.time() - (time.perf_counter() - started) - 1.0  # started_at is rounded to the database's clock
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise RuntimeError(f"the fresh worker exited with code {worker.returncode}; see {log_path}")
        listing = client.get("/workers").json()
        if any(w["online"] and _parse_time(w["started_at"]) >= spawned for w in listing["workers"]):
            return time.perf_counter() - started
        time.sleep(0.02)
    raise RuntimeError(f"the fresh worker was not online after {timeout_s} s; see {log_path}")


def wait_first_epoch(service: Service, job_id: str, sent: float, timeout_s: float) -> float:
    """Seconds from `sent` until the job's first epoch is stored (jobs.epoch >= 1), read from the
    database directly every 20 ms (the API's metrics and events would add their own delays)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(service.database_url)
    deadline = time.monotonic() + timeout_s
    try:
        with engine.connect() as connection:
            while time.monotonic() < deadline:
                row = connection.execute(text("SELECT epoch, status FROM jobs WHERE id = :id"), {"id": job_id}).one()
                connection.rollback()  # a fresh snapshot at each look
                if row.epoch >= 1:
                    return time.perf_counter() - sent
                if row.status in FINAL:
                    raise RuntimeError(f"job {job_id} ended {row.status} before its first epoch")
                time.sleep(0.02)
    finally:
        engine.dispose()
    raise TimeoutError(f"job {job_id} reported no epoch after {timeout_s} s")


def wait_done(client: httpx.Client, job_id: str, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job = client.get(f"/jobs/{job_id}").json()
        if job["status"] in FINAL:
            return job
        time.sleep(0.1)
    raise TimeoutError(f"job {job_id} not done after {timeout_s} s")


def loaded(pid: int, library: str) -> bool:
    """Whether process `pid` has a shared object whose path names `library` mapped."""
    try:
        return library in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def stop(process: subprocess.Popen | None, timeout_s: float = 20.0) -> None:
    """SIGTERM `process` (a worker this module or the service started), SIGKILL after `timeout_s`."""
    if process is None or process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
