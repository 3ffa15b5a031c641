"""How the API uses PostgreSQL: the statements a poll and a submit cost, connections that never
deadlock a busy process, and pooled connections that survive a database restart."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import event, func, select, text

TPU = {"framework": "jax", "hardware": "tpu", "dataset": {"name": "digits"}}


@pytest.fixture
def statements(api):
    """The SQL statements the API sends, in order (`statements.clear()` to start over)."""
    from app.db import get_engine

    sent: list[str] = []

    def record(_conn, _cursor, statement, *_args) -> None:
        sent.append(" ".join(statement.split()))

    engine = get_engine()
    event.listen(engine, "before_cursor_execute", record)
    yield sent
    event.remove(engine, "before_cursor_execute", record)


TABLE = re.compile(r"\b(?:FROM|INTO|UPDATE)\s+(\w+)")


def kinds(sent: list[str]) -> list[str]:
    """Each statement as its verb and first table: 'SELECT api_keys', 'INSERT jobs'..."""
    return [f"{s.split()[0]} {TABLE.search(s).group(1)}" for s in sent]


def test_a_poll_of_a_queued_job_costs_three_statements(api, auth, statements):
    job = api.post("/jobs", json=TPU, headers=auth).json()
    api.get(f"/jobs/{job['id']}", headers=auth)  # reads the online queues, then keeps them for a second
    statements.clear()
    response = api.get(f"/jobs/{job['id']}", headers=auth)
    assert response.status_code == 200 and response.json()["queue_position"] >= 1
    # the key, the job (no metrics or artifacts: no worker started it), its place in the queue
    assert kinds(statements) == ["SELECT api_keys", "SELECT jobs", "SELECT jobs"]


def test_a_submit_costs_eight_statements_and_locks_the_key_only_after_its_insert(api, auth, statements):
    api.get("/jobs", headers=auth)  # the online queues, read once a second
    statements.clear()
    assert api.post("/jobs", json=TPU, headers=auth).status_code == 201
    assert kinds(statements) == [
        "SELECT api_keys",  # the caller's key
        # the key's submissions of the minute (jobs, and refusals: the first table the statement
        # names), asked before its body is validated
        "SELECT rejected_submissions",
        "SELECT jobs",  # the new job's place in its queue
        "SELECT jobs",  # (the key's first queued job there: where the key itself stands)
        "INSERT jobs",
        "SELECT api_keys",  # the quota lock on the key: FOR NO KEY UPDATE, held to the commit
        "SELECT rejected_submissions",  # the key's queued and recent jobs (the new one included) and refusals
        "UPDATE jobs",  # enqueued_at, once the id is in the broker
    ]
    assert "FOR NO KEY UPDATE" in statements[5]


def test_requests_beyond_the_pool_and_the_thread_pool_all_get_answers(api, auth, monkeypatch):
    """More concurrent requests than connections and threads: none may hold a connection while
    it waits for a thread (which could wait for a connection): each is answered, none with 503."""
    from tests.conftest import reset_caches

    job = api.post("/jobs", json=TPU, headers=auth).json()
    monkeypatch.setenv("TRAINHUB_DB_POOL_SIZE", "2")
    monkeypatch.setenv("TRAINHUB_DB_MAX_OVERFLOW", "0")
    monkeypatch.setenv("TRAINHUB_DB_POOL_TIMEOUT_S", "5")
    reset_caches()
    paths = [f"/jobs/{job['id']}", "/jobs", "/workers", f"/jobs/{job['id']}/metrics", f"/jobs/{job['id']}/artifacts"]
    with ThreadPoolExecutor(64) as pool:
        codes = list(pool.map(lambda i: api.get(paths[i % len(paths)], headers=auth).status_code, range(320)))
    assert codes == [200] * 320


def test_a_dead_pooled_connection_is_replaced_once_it_was_idle(services_env, database_url):
    """A connection whose server process ended (a database restart) is pinged before it is used
    again after PING_AFTER_IDLE_S, and replaced: the next statement works."""
    from app.db import PING_AFTER_IDLE_S, make_engine

    engine = make_engine(database_url)
    try:
        with engine.connect() as connection, engine.connect() as other:  # two pooled connections
            backend = connection.execute(select(func.pg_backend_pid())).scalar_one()
            connection.commit()
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": backend})
        time.sleep(PING_AFTER_IDLE_S + 0.2)
        for _ in range(2):  # both pooled connections: the dead one is replaced, the live one used
            with engine.connect() as connection:
                assert connection.execute(select(func.pg_backend_pid())).scalar_one() != backend
    finally:
        engine.dispose()
