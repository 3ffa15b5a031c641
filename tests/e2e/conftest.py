"""Real processes: uvicorn serving the API and `trainhub worker` over PostgreSQL and Redis."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from app.client import TrainhubClient
from app.stack import Stack, free_port


def wait_for(predicate, timeout_s: float = 60.0, what: str = "condition"):
    """Poll `predicate` until it returns something truthy (returned); AssertionError on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def pytest_collection_modifyitems(items):
    # The hook sees the whole session's items, not only this folder's: mark only the e2e tests.
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.e2e)


@dataclass
class Service:
    url: str
    env: dict[str, str]
    stack: Stack
    artifact_dir: Path
    admin_key: str = ""  # made by the modules that need one

    def new_key(self, name: str = "e2e", admin: bool = False) -> str:
        """A key made the way a user makes one: `trainhub keys create`, last line of stdout."""
        out = subprocess.run([sys.executable, "-m", "app.cli", "keys", "create", "--name", name,
                              *(["--admin"] if admin else [])],
                             env=self.env, capture_output=True, text=True, check=True).stdout
        return out.strip().splitlines()[-1]

    def client(self, key: str | None = None) -> TrainhubClient:
        return TrainhubClient(self.url, key or self.new_key())

    def start_worker(self, *args: str, log: Path | None = None) -> subprocess.Popen:
        """Start `trainhub worker ARGS`; its output goes to `log` when given, else to the test's."""
        output = open(log, "ab") if log else None
        process = subprocess.Popen([sys.executable, "-m", "app.cli", "worker", *args], env=self.env,
                                   stdout=output, stderr=subprocess.STDOUT if output else None)
        if output:
            output.close()
        self.stack.processes.append(process)
        return process


def damaged_dataset_job(service: Service, client: TrainhubClient, tmp_path: Path, **spec) -> dict:
    """A job on an uploaded dataset whose stored copy was then damaged (as a disk or a bucket
    may): the worker's fetch finds the sha256 wrong and fails it `dataset_corrupt`."""
    import numpy as np

    rng = np.random.default_rng()
    csv = tmp_path / "damaged.csv"
    csv.write_text("a,b,label\n" + "".join(f"{rng.random()},{rng.random()},{i % 2}\n" for i in range(40)))
    dataset = client.upload_dataset(csv)
    (service.artifact_dir / "datasets" / f"{dataset['sha256']}.safetensors").write_bytes(b"damaged")
    body = {"framework": "jax", "dataset": {"id": dataset["id"], "validation_split": 0.25}, "batch_size": 8, **spec}
    return client.submit(body)


def forget_unfinished_jobs(database_url: str) -> None:
    """End what earlier tests left queued or running, so this module's workers (whose reconciler
    resends queued jobs to an emptied broker) do not run them."""
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status IN ('queued', 'running')"))
    engine.dispose()


@contextmanager
def running_service(database_url: str, broker_url: str, root: Path, workers: int = 1,
                    api_database_url: str | None = None, **settings: str):
    """The API and `workers` cpu workers on `broker_url`; `settings` are extra TRAINHUB_* values
    (e.g. heartbeat_s="0.5"); `api_database_url` gives the API another way to the database
    (through a proxy a test can cut). Stops them all on exit."""
    forget_unfinished_jobs(database_url)
    env = {
        **os.environ,
        "TRAINHUB_DATABASE_URL": database_url,
        "TRAINHUB_BROKER_URL": broker_url,
        "TRAINHUB_ARTIFACT_DIR": str(root / "artifacts"),
        "TRAINHUB_VAR_DIR": str(root / "var"),
        "TRAINHUB_COMPILE_CACHE_DIR": str(root / "jax-cache"),
        **{f"TRAINHUB_{name.upper()}": value for name, value in settings.items()},
    }
    port = free_port()
    stack = Stack(url=f"http://127.0.0.1:{port}")
    api_env = {**env, "TRAINHUB_DATABASE_URL": api_database_url or database_url}
    stack.processes.append(subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:app", "--port", str(port), "--log-level", "warning"], env=api_env))
    svc = Service(url=stack.url, env=env, stack=stack, artifact_dir=root / "artifacts")
    for i in range(workers):
        # One core each, as in production (one worker per device): two workers sharing both
        # cores oversubscribe their BLAS threads and crawl.
        svc.start_worker("--hardware", "cpu", *(["--devices", str(i % os.cpu_count())] if workers > 1 else []))
    try:
        stack.wait_ready()
        yield svc
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def service(database_url, redis_url, tmp_path_factory) -> Service:
    """The API and one cpu worker, shared by the tests of a module."""
    redis.Redis.from_url(redis_url).flushdb()
    with running_service(database_url, redis_url, tmp_path_factory.mktemp("service")) as svc:
        yield svc


class RedisServer:
    """A private redis-server on a free port, for tests that stop and restart the broker.
    Like the machine's, it keeps nothing on disk: a restart loses every message."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)], stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                client.ping()
                return
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
