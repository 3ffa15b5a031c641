"""Shared fixtures: the real PostgreSQL and Redis of the machine, and settings pointing at them.

TRAINHUB_TEST_DATABASE_URL and TRAINHUB_TEST_REDIS_URL name the services (defaults: the local
ones). With TRAINHUB_REQUIRE_SERVICES=1 (set by .ci/run) a missing service fails the tests
instead of skipping them. Under pytest-xdist (`make test` runs two workers) worker gwN, N > 0,
uses the database named with `_gwN` appended (created when missing) and the Redis db N below
the one named, so the workers never see each other's rows or messages.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytest_plugins = ["tests.all_ran"]

DEFAULT_DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"


def _unavailable(what: str, exc: Exception) -> None:
    message = f"{what} is not reachable: {exc}"
    if os.environ.get("TRAINHUB_REQUIRE_SERVICES") == "1":
        pytest.fail(message)
    pytest.skip(message)


def worker_index() -> int:
    """N of pytest-xdist's worker gwN running this test; 0 without xdist."""
    return int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))


def reset_caches() -> None:
    """Forget cached settings, engines, the Celery app and the online queues, so a changed
    environment (and the heartbeats a test wrote) apply."""
    from app import config, db, jobs, queue
    from app.sweeps import study

    # The engines' pools are closed, not left to the garbage collector: a test session would
    # otherwise hold tens of idle connections, and PostgreSQL allows 100 in all.
    # (The reader sessions' engine shares this one's pool.)
    if db.get_engine.cache_info().currsize:
        db.get_engine().dispose()
    config.get_settings.cache_clear()
    study.get_storage.cache_clear()
    db.get_engine.cache_clear()
    db.get_sessionmaker.cache_clear()
    db.get_reader_sessionmaker.cache_clear()
    queue.get_celery.cache_clear()
    jobs.forget_online_queues()


@pytest.fixture(scope="session")
def database_url() -> str:
    """A migrated, empty PostgreSQL database."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from bench.service import ensure_database

    url = os.environ.get("TRAINHUB_TEST_DATABASE_URL", DEFAULT_DATABASE_URL)
    if worker_index():
        named = make_url(url)
        url = named.set(database=f"{named.database}_gw{worker_index()}").render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        ensure_database(url)
        with engine.begin() as connection:
            connection.execute(text("DROP SCHEMA public CASCADE"))
            connection.execute(text("DROP SCHEMA IF EXISTS optuna CASCADE"))  # sweeps' studies
            connection.execute(text("CREATE SCHEMA public"))
    except Exception as exc:
        _unavailable("PostgreSQL", exc)
    finally:
        engine.dispose()
    from app.db import migrate

    migrate(url)
    return url


@pytest.fixture(scope="session")
def redis_url() -> str:
    from urllib.parse import urlsplit

    import redis

    url = os.environ.get("TRAINHUB_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    if worker_index():
        parts = urlsplit(url)
        db = (int(parts.path.strip("/") or 0) - worker_index()) % 16
        url = parts._replace(path=f"/{db}").geturl()
    try:
        redis.Redis.from_url(url).flushdb()
    except Exception as exc:
        _unavailable("Redis", exc)
    return url


@pytest.fixture
def services_env(database_url, redis_url, tmp_path, monkeypatch) -> dict[str, str]:
    """TRAINHUB_* settings for PostgreSQL, Redis (emptied, so no earlier test's message reaches
    this test's workers) and a fresh artifact dir, applied to this process and returned for
    child processes."""
    import redis

    redis.Redis.from_url(redis_url).flushdb()
    env = {
        "TRAINHUB_DATABASE_URL": database_url,
        "TRAINHUB_BROKER_URL": redis_url,
        "TRAINHUB_ARTIFACT_DIR": str(tmp_path / "artifacts"),
        "TRAINHUB_VAR_DIR": str(tmp_path / "var"),
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    reset_caches()
    yield env
    reset_caches()


@pytest.fixture
def api(services_env):
    """A TestClient of the app on PostgreSQL and Redis."""
    from fastapi.testclient import TestClient

    from app.main import create_app

    with TestClient(create_app()) as client:
        yield client


@pytest.fixture
def make_key(services_env):
    """Create API keys: `make_key("alice")` returns the secret."""
    from app.db import session_scope
    from app.keys import create_key

    def make(name: str = "test", admin: bool = False) -> str:
        with session_scope() as session:
            return create_key(session, name, admin=admin)[1]

    return make


@pytest.fixture
def auth(make_key) -> dict[str, str]:
    return {"Authorization": f"Bearer {make_key('owner')}"}


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def s3_server() -> str:
    """A real S3 API on loopback: moto's server mode on a free port. Returns its endpoint URL."""
    import subprocess
    import sys
    import time

    import httpx

    from app.stack import free_port

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{url}/moto-api/", timeout=1)
                break
            except httpx.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"moto_server did not start on {url}")
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture
def s3_env(s3_server) -> dict[str, str]:
    """TRAINHUB_* settings for the S3 artifact store on `s3_server`, with a new empty bucket."""
    import uuid

    import boto3

    bucket = f"trainhub-{uuid.uuid4().hex[:12]}"
    env = {
        "TRAINHUB_ARTIFACT_STORE": "s3",
        "TRAINHUB_S3_BUCKET": bucket,
        "TRAINHUB_S3_PREFIX": "artifacts/",
        "TRAINHUB_S3_ENDPOINT_URL": s3_server,
        "TRAINHUB_S3_REGION": "us-east-1",
        "TRAINHUB_S3_ACCESS_KEY_ID": "testing",
        "TRAINHUB_S3_SECRET_ACCESS_KEY": "testing",
    }
    boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="testing",
                 aws_secret_access_key="testing").create_bucket(Bucket=bucket)
    return env
