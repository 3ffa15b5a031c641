"""trainhub as a service, for the benchmark: the real API and worker processes over PostgreSQL
and Redis, started the way tests/e2e/conftest.py starts them.

- `Service.start` runs `uvicorn app.main:app` and `python -m workers --hardware cpu` with the
  bench's own database, Redis db, artifact dir and a fresh JAX compilation cache;
- `run_job` submits a job over HTTP, waits for it and measures submit-to-succeeded;
- `job_series` runs jobs one after another, reading the worker's resident memory after each;
- `ensure_database` creates the bench's PostgreSQL database when the server has none.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import httpx

from bench.procs import die_with_parent


# The queues bench jobs go to: the worker's, and tpu.jax, which no bench worker consumes.
BENCH_QUEUES = ("cpu.jax", "cpu.pytorch", "tpu.jax")
QUOTAS = {"TRAINHUB_MAX_SUBMISSIONS_PER_MINUTE": "1000000", "TRAINHUB_MAX_QUEUED_JOBS_PER_KEY": "1000000"}
# The upload limits the datasets part needs (the defaults), whatever the caller's environment says:
# a 1 GiB body must be streamed in full, not refused from its Content-Length, and the 50 MB CSV
# (~260,000 rows) must be accepted.
UPLOAD_LIMITS = {"TRAINHUB_MAX_DATASET_BYTES": str(2 * 1024**3),
                 "TRAINHUB_MAX_DATASET_BYTES_PER_KEY": str(20 * 1024**3),
                 "TRAINHUB_MAX_DATASET_EXAMPLES": "1000000"}


def ensure_database(database_url: str) -> bool:
    """Create the PostgreSQL database that `database_url` names when the server has none of that
    name (`make bench` uses its own, `bench`; the API migrates it at start). True when it was
    created now; False when it was there already or the URL is not PostgreSQL. Raises what
    connecting to the server's `postgres` database raises."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ProgrammingError

    url = make_url(database_url)
    if not url.drivername.startswith("postgresql") or not url.database or url.database == "postgres":
        return False
    # CREATE DATABASE runs outside a transaction, from another database of the same server.
    engine = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT",
                           connect_args={"connect_timeout": 3})

    def exists(connection) -> bool:
        return connection.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"),
                                  {"n": url.database}).first() is not None

    try:
        with engine.connect() as connection:
            if exists(connection):
                return False
            try:
                name = connection.dialect.identifier_preparer.quote(url.database)
                connection.execute(text(f"CREATE DATABASE {name}"))
            except ProgrammingError:  # another bench created it meanwhile
                if exists(connection):
                    return False
                raise
            return True
    finally:
        engine.dispose()


def check_reachable(database_url: str, redis_url: str) -> str | None:
    """None when PostgreSQL and Redis answer; otherwise why not, in words."""
    import redis
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url, connect_args={"connect_timeout": 3} if "postgresql" in database_url else {})
    try:
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        return f"the database at {database_url} is not reachable ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    finally:
        engine.dispose()
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=3).ping()
    except Exception as exc:
        return f"Redis at {redis_url} is not reachable ({type(exc).__name__}: {exc})"
    return None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vm_rss_bytes(pid: int) -> int:
    """Resident memory of process `pid` from /proc/<pid>/status (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024  # reported in kB
    raise RuntimeError(f"no VmRSS for process {pid}")


@dataclass
class Service:
    """The API and one cpu worker, as child processes; stop() ends exactly those."""

    database_url: str
    redis_url: str
    root: Path
    url: str = ""
    env: dict[str, str] = field(default_factory=dict)
    api: subprocess.Popen | None = None
    worker: subprocess.Popen | None = None
    key: str = ""
    api_workers: int = 1  # uvicorn processes serving the API
    with_worker: bool = True  # False: the API alone (bench/scale.py: nothing trains, no reconciler)
    extra_env: dict[str, str] = field(default_factory=dict)  # set for both processes, over the rest

    def start(self, timeout_s: float = 120.0) -> None:
        self.clear_leftovers()
        self.env = {
            **os.environ,
            "TRAINHUB_DATABASE_URL": self.database_url,
            "TRAINHUB_BROKER_URL": self.redis_url,
            "TRAINHUB_ARTIFACT_DIR": str(self.root / "artifacts"),
            "TRAINHUB_VAR_DIR": str(self.root / "var"),
            # A fresh cache, so the first JAX job compiles for real and the second may reuse it.
            "TRAINHUB_COMPILE_CACHE_DIR": str(self.root / "jax-cache"),
            # Fresh too: the first job on an uploaded dataset is a cache miss, the second a hit.
            "TRAINHUB_DATASET_CACHE_DIR": str(self.root / "dataset-cache"),
            "TRAINHUB_UPLOAD_DIR": str(self.root / "uploads"),
            **UPLOAD_LIMITS,
            # The per-key quotas (60 jobs a minute, 100 queued by default) would stop the load
            # test of the API after a second; it measures the API, so the operator raises them.
            **QUOTAS,
            "TRAINHUB_ALLOW_USER_CODE": "1",  # the user-code row (bench/user_code.py)
            **self.extra_env,
        }
        logs = self.root / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.api = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port), "--log-level", "warning",
             "--workers", str(self.api_workers)],
            env=self.env, stdout=open(logs / "api.log", "ab"), stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
        )
        # Both start at once (they migrate under a lock); the key is made while the worker imports.
        if self.with_worker:
            self.worker = subprocess.Popen(
                [sys.executable, "-m", "workers", "--hardware", "cpu"],
                env=self.env, stdout=open(logs / "worker.log", "ab"), stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,
            )
        self._wait_ready(timeout_s)
        self.key = subprocess.run(
            [sys.executable, "-m", "app.cli", "keys", "create", "--name", "bench", "--allow-code"],
            env=self.env, capture_output=True, text=True, check=True, preexec_fn=die_with_parent,
        ).stdout.strip().splitlines()[-1]
        if self.with_worker:
            self._wait_worker(timeout_s)

    def clear_leftovers(self) -> None:
        """Cancel the bench jobs an interrupted run left queued or running (a job is the bench's
        when its labels have a "bench" key) and empty the queues the bench uses, so neither
        reaches this run's worker or counts. Redis is not flushed: the workers' reconciler
        would take a flushed broker for one that lost its messages and send every queued job
        again."""
        import redis
        from sqlalchemy import create_engine, text

        engine = create_engine(self.database_url)
        try:
            with engine.begin() as connection:
                if connection.dialect.name == "postgresql" and connection.execute(
                        text("SELECT to_regclass('jobs') IS NOT NULL")).scalar():
                    connection.execute(text(
                        "UPDATE jobs SET status = 'cancelled', finished_at = now() "
                        "WHERE status IN ('queued', 'running') AND (spec::jsonb -> 'labels') ? 'bench'"))
        finally:
            engine.dispose()
        redis.Redis.from_url(self.redis_url).delete(*BENCH_QUEUES)

    def wait_reconciled(self, timeout_s: float = 30.0) -> bool:
        """Until the worker's reconciler has looked at the broker once (its marker key is set),
        so it will not resend the queued jobs in the middle of a measurement. False if it never
        did within `timeout_s` (or this version of the workers has no such marker)."""
        import redis

        try:
            from workers.reconciler import BROKER_MARKER
        except ImportError:
            return False
        client = redis.Redis.from_url(self.redis_url)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if client.exists(BROKER_MARKER):
                return True
            time.sleep(0.2)
        return False

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.api.poll() is not None:
                raise RuntimeError(f"the API exited with code {self.api.returncode}; see {self.root}/logs/api.log")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the API at {self.url} was not ready after {timeout_s} s")

    def _wait_worker(self, timeout_s: float) -> None:
        """Until Celery says the worker is ready to consume (its log line "ready.")."""
        log = self.root / "logs" / "worker.log"
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.worker.poll() is not None:
                raise RuntimeError(f"the worker exited with code {self.worker.returncode}; see {log}")
            if log.exists() and " ready." in log.read_text(errors="replace"):
                return
            time.sleep(0.2)
        raise RuntimeError(f"the worker was not ready after {timeout_s} s; see {log}")

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=30)

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM the worker and the API (the ones this object started), then SIGKILL stragglers."""
        processes = [p for p in (self.worker, self.api) if p is not None]
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for process in processes:
            try:
                process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _parse_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def run_job(client: httpx.Client, spec: dict, timeout_s: float = 600.0, poll_s: float = 0.1) -> dict:
    """Submit `spec`, wait until the job ends; the job and its submit-to-succeeded figures.

    submit_to_done_s runs from just before the POST is sent to the job's finished_at (the
    moment the worker committed "succeeded"): API, worker and bench share the machine's clock,
    so it needs no polling. observed_s is when this poller (every `poll_s`) first saw it.
    overhead_s = submit_to_done_s - (setup_s + train_s): all the time that was not the job's
    own data/model setup or training steps.
    """
    sent = time.time()
    start = time.perf_counter()
    response = client.post("/jobs", json=spec)
    response.raise_for_status()
    job = response.json()
    while job["status"] not in ("succeeded", "failed", "cancelled"):
        if time.perf_counter() - start > timeout_s:
            raise TimeoutError(f"job {job['id']} still {job['status']} after {timeout_s} s")
        time.sleep(poll_s)
        job = client.get(f"/jobs/{job['id']}").json()
    observed_s = time.perf_counter() - start
    out = {"id": job["id"], "status": job["status"], "error": job.get("error"), "observed_s": observed_s,
           "timings": job.get("timings") or {}, "result": job.get("result") or {}}
    if job["status"] == "succeeded":
        timings = job["timings"]
        out["submit_to_done_s"] = _parse_time(job["finished_at"]) - sent
        out["overhead_s"] = out["submit_to_done_s"] - (timings["setup_s"] + timings["train_s"])
    return out


def job_series(service: Service, client: httpx.Client, specs: list[dict], settle_s: float = 0.3) -> list[dict]:
    """Run `specs` one after another; each result gets `rss_bytes`, the worker's VmRSS after it."""
    results = []
    for spec in specs:
        result = run_job(client, spec)
        time.sleep(settle_s)  # let the worker finish acknowledging the task
        result["rss_bytes"] = vm_rss_bytes(service.worker.pid)
        result["framework"] = spec["framework"] + ("+compile" if spec.get("compile") else "")
        results.append(result)
    return results
