"""The job's transitions (app/lifecycle.py) refuse the states they must, and the reconciler finds
lost jobs and lost messages (workers/reconciler.py), on real PostgreSQL and Redis."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from sqlalchemy import select, update

DIGITS = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1}


@pytest.fixture(autouse=True)
def no_workers(services_env):
    """No heartbeat rows but this test's, before and after it."""
    from sqlalchemy import delete

    from app.db import session_scope
    from app.models import Worker

    def clear() -> None:
        with session_scope() as session:
            session.execute(delete(Worker))
            session.commit()

    clear()
    yield
    clear()


@pytest.fixture
def job_id(api, auth) -> str:
    return api.post("/jobs", json=DIGITS, headers=auth).json()["id"]


def row(job_id: str):
    from app.db import session_scope
    from app.models import Job

    with session_scope() as session:
        return session.get(Job, job_id)


def test_each_transition_refuses_the_states_it_must(job_id):
    from app import lifecycle
    from app.db import session_scope
    from app.lifecycle import JobStatus
    from app.models import utcnow

    with session_scope() as s:
        assert lifecycle.finish(s, job_id, 1, JobStatus.SUCCEEDED) is False  # not running: no finish
        assert lifecycle.claim(s, job_id, {"name": "w"}, utcnow()) == 1
        assert lifecycle.claim(s, job_id, {"name": "w2"}, utcnow()) is None  # a second claim loses
        assert lifecycle.finish(s, job_id, 2, JobStatus.SUCCEEDED) is False  # another attempt's finish
        assert lifecycle.release(s, job_id, 1) == JobStatus.QUEUED
        assert lifecycle.finish(s, job_id, 1, JobStatus.SUCCEEDED) is False  # a finish of a released job
        assert lifecycle.retry(s, job_id, 0, {"type": "worker_lost", "message": "gone"}, 2) is False  # not running
        lifecycle.cancel(s, job_id)
        assert lifecycle.claim(s, job_id, {"name": "w"}, utcnow()) is None  # a cancelled job is never claimed
    assert row(job_id).status == JobStatus.CANCELLED and row(job_id).attempts == 0


def test_a_finished_job_cannot_be_cancelled_or_requeued(job_id):
    from app import lifecycle
    from app.db import session_scope
    from app.lifecycle import JobStatus
    from app.models import utcnow

    with session_scope() as s:
        attempt = lifecycle.claim(s, job_id, {"name": "w"}, utcnow())
        assert lifecycle.finish(s, job_id, attempt, JobStatus.SUCCEEDED)
        lifecycle.cancel(s, job_id)
        assert lifecycle.retry(s, job_id, attempt, {"type": "worker_lost", "message": "gone"}, 2) is False
        assert lifecycle.fail_lost(s, job_id, attempt, "gone") is False
    assert row(job_id).status == JobStatus.SUCCEEDED and not row(job_id).cancel_requested


def beat_as(name: str, current_job_id: str | None, seconds_after_claim: float, job_id: str) -> None:
    from app.db import session_scope
    from app.models import Job, Worker

    with session_scope() as session:
        started_at = session.get(Job, job_id).started_at
        session.add(Worker(name=name, hostname="host", hardware="cpu", queues=["cpu.jax"], devices=["cpu:0"],
                           versions={}, current_job_id=current_job_id, started_at=started_at,
                           last_seen=started_at + timedelta(seconds=seconds_after_claim)))
        session.commit()


def claim_as(job_id: str, name: str) -> None:
    from app import lifecycle
    from app.db import session_scope
    from app.models import utcnow

    with session_scope() as s:
        lifecycle.claim(s, job_id, {"name": name}, utcnow())


def test_a_live_worker_that_names_another_job_has_lost_its_claim(job_id):
    """A worker restarted under the same name (PID 1 in a container), or one whose last write of
    the job never reached the database, is alive but no longer runs the job: it goes back to the queue."""
    from workers.reconciler import requeue_lost_jobs

    claim_as(job_id, "host:1:aaaa")
    beat_as("host:1:aaaa", None, seconds_after_claim=1.0, job_id=job_id)
    requeue_lost_jobs()
    assert row(job_id).status == "queued"


def test_a_live_worker_running_the_job_keeps_it_even_before_its_next_beat(job_id):
    from workers.reconciler import requeue_lost_jobs

    claim_as(job_id, "host:1:bbbb")
    beat_as("host:1:bbbb", None, seconds_after_claim=-0.5, job_id=job_id)  # a beat from before the claim
    requeue_lost_jobs()
    assert row(job_id).status == "running"
    from app.db import session_scope
    from app.models import Worker

    with session_scope() as session:
        session.execute(update(Worker).where(Worker.name == "host:1:bbbb").values(current_job_id=job_id))
        session.commit()
    requeue_lost_jobs()
    assert row(job_id).status == "running"


def test_worker_names_are_unique_per_process_start():
    from workers.hardware import Capabilities
    from workers.identity import register

    caps = Capabilities(hardware="cpu", queues=["cpu.jax"], devices=["cpu:0"], versions={}, refused={})
    first, second = register(caps).name, register(caps).name
    assert first != second and first.rsplit(":", 1)[0] == second.rsplit(":", 1)[0]  # same host:pid


def test_a_worker_without_its_broker_is_not_online(api, auth, services_env, monkeypatch):
    from app import jobs
    from workers.hardware import Capabilities
    from workers.identity import beat, register

    identity = register(Capabilities(hardware="cpu", queues=["cpu.jax"], devices=["cpu:0"], versions={}, refused={}))
    monkeypatch.setenv("TRAINHUB_BROKER_URL", "redis://127.0.0.1:1/0")  # nothing listens there
    from tests.conftest import reset_caches

    reset_caches()
    beat(identity)
    monkeypatch.setenv("TRAINHUB_BROKER_URL", services_env["TRAINHUB_BROKER_URL"])
    reset_caches()
    from app.rendering import worker_alias

    alias = worker_alias(identity.name)  # what a user key sees of the worker's name
    listed = {w["name"]: w for w in api.get("/workers", headers=auth).json()["workers"]}[alias]
    assert listed["broker_connected"] is False and listed["online"] is False
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    jobs.forget_online_queues()
    assert api.get(f"/jobs/{job['id']}", headers=auth).json()["waiting_reason"] == "no online worker serves cpu.jax"
    beat(identity)  # the broker answers again
    jobs.forget_online_queues()
    listed = {w["name"]: w for w in api.get("/workers", headers=auth).json()["workers"]}[alias]
    assert listed["broker_connected"] is True and listed["online"] is True


def test_queued_jobs_whose_message_the_broker_lost_are_sent_again_once(api, auth, services_env):
    from app.db import session_scope
    from app.models import Job
    from workers import reconciler

    with session_scope() as session:  # earlier tests' queued jobs (their messages flushed) are not this test's
        session.execute(update(Job).where(Job.status == "queued").values(status="cancelled"))
        session.commit()
    ids = [api.post("/jobs", json=DIGITS, headers=auth).json()["id"] for _ in range(3)]
    client = redis.Redis.from_url(services_env["TRAINHUB_BROKER_URL"])
    assert client.llen("cpu.jax") == 3
    with session_scope() as session:  # sent long enough ago that their messages must be there
        session.execute(update(Job).where(Job.id.in_(ids)).values(
            enqueued_at=Job.enqueued_at - timedelta(seconds=reconciler.MESSAGE_GRACE_S + 1)))
        session.commit()
    reconciler.resend_lost_messages()
    assert client.llen("cpu.jax") == 3  # none was lost: nothing sent again
    client.delete(reconciler.SCAN_LOCK)

    kept = client.lindex("cpu.jax", 0)
    client.delete("cpu.jax")  # the broker loses two messages (an older snapshot, a deleted list)
    client.rpush("cpu.jax", kept)
    for _ in range(3):  # several workers' reconcilers at once: one scan, one message each
        reconciler.resend_lost_messages()
    messages = client.lrange("cpu.jax", 0, -1)
    assert len(messages) == 3
    assert sorted(i for i in ids if any(i.encode() in m for m in messages)) == sorted(ids)
    with session_scope() as session:
        assert set(session.scalars(select(Job.status).where(Job.id.in_(ids)))) == {"queued"}
