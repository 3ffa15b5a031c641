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


def test_a_page_of_queued_jobs_costs_as_many_statements_whatever_its_size(api, auth, statements):
    for seed in range(12):
        api.post("/jobs", json={**TPU, "seed": seed}, headers=auth)
    api.get("/jobs?limit=1", headers=auth)  # the online queues, read once a second
    statements.clear()
    small = api.get("/jobs?limit=3", headers=auth).json()["items"]
    three = kinds(statements)
    statements.clear()
    full = api.get("/jobs?limit=12", headers=auth).json()["items"]
    assert [job["queue_position"] for job in full[:3]] == [job["queue_position"] for job in small]
    assert len({job["queue_position"] for job in full}) == 12
    # the key, the page, its metrics and artifacts (SQLAlchemy loads the two in either order), the
    # queue's turns with the jobs' ranks in their keys
    loads = {"SELECT epoch_metrics", "SELECT artifacts"}
    for sent in (three, kinds(statements)):
        assert sent[:2] == ["SELECT api_keys", "SELECT jobs"] and set(sent[2:4]) == loads, sent
        assert sent[4:] == ["SELECT jobs"], sent


def test_a_submit_costs_seven_statements_and_locks_the_key_only_after_its_insert(api, auth, statements):
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
        # the key's quota lock, its queued jobs (tally) and recent submissions counted after the
        # lock, and the COMMIT: one query, so the lock is never held waiting for the API process
        "SELECT trainhub_check_quota",
        "UPDATE jobs",  # enqueued_at, once the id is in the broker
    ]
    assert statements[5].rstrip().endswith("; COMMIT")


def test_a_submit_waits_for_the_keys_quota_lock_not_behind_other_uncommitted_jobs(api, auth, services_env):
    """A transaction of the key holding its quota lock with 40 uncommitted jobs: another
    submission of the key stores its row and then waits for the lock alone, not at its INSERT
    (the tally counter rows those jobs change are written at their commit), and is 201 after."""
    from app import jobs, limits
    from app.db import session_scope
    from app.keys import find_key
    from app.schemas import JobSpec

    secret = auth["Authorization"].split()[1]
    with session_scope() as holder, session_scope() as watcher:
        owner = find_key(holder, secret)
        for seed in range(40):  # (any of the key's four counter rows, 1 - 4 * 0.75^40 sure)
            holder.add(jobs.new_job(owner, JobSpec.model_validate({**TPU, "seed": seed})))
        holder.flush()
        limits.lock_key(holder, owner)
        with ThreadPoolExecutor(1) as pool:
            submitted = pool.submit(api.post, "/jobs", json=TPU, headers=auth)
            waiting = None
            deadline = time.monotonic() + 10
            while waiting is None and time.monotonic() < deadline:
                waiting = watcher.execute(text(
                    "SELECT wait_event, query FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()")).first()
                watcher.rollback()
                time.sleep(0.02)
            holder.commit()
            assert submitted.result(timeout=10).status_code == 201
    assert waiting is not None, "the submission never waited for the key's lock"
    assert waiting.wait_event == "advisory" and "trainhub_check_quota" in waiting.query


def test_the_quota_in_the_database_counts_what_the_rows_say(api, auth, rows, services_env):
    """trainhub_check_quota (migration 0026) counts the key's queued jobs (from its job_counts
    tally), and its jobs and refused submissions of the last minute, as the rows say: a new job
    is refused exactly at each limit, the refusal naming those counts, and committed below them."""
    from datetime import timedelta

    from app import jobs, limits
    from app.config import Settings
    from app.db import session_scope
    from app.keys import find_key
    from app.models import Job, RejectedSubmission, utcnow
    from app.schemas import JobSpec

    ids = [api.post("/jobs", json={**TPU, "seed": i}, headers=auth).json()["id"] for i in range(5)]
    rows.start(ids[0])
    rows.finish(ids[1])
    secret = auth["Authorization"].split()[1]
    with session_scope() as session:
        owner = find_key(session, secret)
        session.get(Job, ids[2]).created_at = utcnow() - timedelta(minutes=5)  # queued, not recent
        session.get(Job, ids[1]).created_at = utcnow() - timedelta(minutes=5)  # neither
        session.add_all([RejectedSubmission(owner_id=owner.id, at=utcnow()),
                         RejectedSubmission(owner_id=owner.id, at=utcnow() - timedelta(minutes=2))])
        session.commit()
        queued = session.scalar(select(func.count()).where(Job.owner_id == owner.id, Job.status == "queued"))
        assert queued == 3  # ids 2, 3, 4; recent: 0, 3, 4 and one refusal

        def submit(**limit: int) -> None:
            session.add(jobs.new_job(owner, JobSpec.model_validate(TPU)))
            session.flush()
            settings = Settings(**{"max_queued_jobs_per_key": 100, "max_submissions_per_minute": 100, **limit})
            limits.commit_within_quota(session, owner, 1, settings)

        with pytest.raises(limits.QuotaExceeded, match=r"has 3 job\(s\) queued; the limit is 3"):
            submit(max_queued_jobs_per_key=3)
        with pytest.raises(limits.QuotaExceeded, match=r"sent 4 submission\(s\) in the last minute; the limit is 4"):
            submit(max_submissions_per_minute=4)
        assert session.scalar(select(func.count()).where(Job.owner_id == owner.id)) == 5  # both rolled back
        submit(max_queued_jobs_per_key=4, max_submissions_per_minute=5)
        assert session.scalar(select(func.count()).where(Job.owner_id == owner.id, Job.status == "queued")) == 4


def test_transactions_read_committed_whatever_the_servers_default(services_env, monkeypatch):
    """The quotas count under a lock and must see the jobs committed before it was taken: under
    a server default of repeatable read they would count a snapshot from before the lock."""
    from sqlalchemy import make_url

    from app.db import session_scope
    from tests.conftest import reset_caches

    url = make_url(services_env["TRAINHUB_DATABASE_URL"])
    url = url.update_query_dict({"options": "-c default_transaction_isolation=serializable"})
    monkeypatch.setenv("TRAINHUB_DATABASE_URL", url.render_as_string(hide_password=False))
    reset_caches()
    with session_scope() as session:
        assert session.execute(text("SHOW default_transaction_isolation")).scalar() == "serializable"
        assert session.execute(text("SHOW transaction_isolation")).scalar() == "read committed"


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
