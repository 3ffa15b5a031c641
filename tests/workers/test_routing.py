"""A worker runs only jobs of the queues it checked it can serve, and a job never falls back to
the CPU: a misrouted message is sent back unclaimed, and a trainer that does not get the
backend the job asks for fails the job."""

from __future__ import annotations

import pytest
import redis

GPU_JOB = {"framework": "jax", "hardware": "gpu", "dataset": {"name": "digits"}, "epochs": 1}


@pytest.fixture(autouse=True)
def no_waiting_jobs(services_env):
    """End what earlier tests left queued: a message is a turn in its queue (app/scheduling.py),
    and the worker here must find only this test's jobs waiting."""
    from sqlalchemy import text

    from app.db import session_scope

    with session_scope() as session:
        session.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status IN ('queued', 'running')"))
        session.commit()


def test_a_message_for_hardware_the_worker_lacks_is_never_run(api, auth, redis_url):
    from workers import identity, tasks
    from workers.hardware import Capabilities

    broker = redis.Redis.from_url(redis_url)
    job = api.post("/jobs", json=GPU_JOB, headers=auth).json()
    assert broker.llen("gpu.jax") == 1
    # A cpu worker gets the id anyway (sent to its queue by hand, or by a misconfigured API).
    identity.register(Capabilities(hardware="cpu", queues=["cpu.jax", "cpu.pytorch"], devices=["cpu:0"]))
    assert tasks.run_job(job["id"]) == "misrouted"
    after = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert after["status"] == "queued" and after["attempts"] == 0
    assert after["started_at"] is None and after["worker"] is None
    assert broker.llen("gpu.jax") == 2  # sent back to its own queue for a gpu worker
    assert broker.llen("cpu.jax") == 0


def test_a_trainer_without_the_backend_fails_the_job_instead_of_using_the_cpu(api, auth):
    from workers import runner

    job = api.post("/jobs", json=GPU_JOB, headers=auth).json()
    # A worker that believes it serves gpu.jax (its check passed, then the device went away).
    worker = {"name": "test:1", "hostname": "test", "hardware": "gpu", "devices": ["gpu:0"], "versions": {}}
    assert runner.run(job["id"], worker, serves=["gpu.jax"]) == "failed"
    after = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert after["status"] == "failed" and after["error"]["type"] == "hardware_mismatch"
    assert "'gpu'" in after["error"]["message"] and "cpu" in after["error"]["message"]
    assert after["metrics"] == [] and after["artifacts"] == []


def test_a_worker_shutting_down_requeues_its_job_unless_it_was_cancelled(api, auth, redis_url):
    from workers import runner

    broker = redis.Redis.from_url(redis_url)
    worker = {"name": "test:2", "hostname": "test", "hardware": "cpu", "devices": ["cpu:0"], "versions": {}}
    spec = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1}
    kept, cancelled = (api.post("/jobs", json={**spec, "seed": s}, headers=auth).json()["id"] for s in (1, 2))
    for job_id in (kept, cancelled):
        assert runner.claim(job_id, worker) is not None  # running, attempt 1
    # A cancel that comes while the worker shuts down (the job is still running): 202, flagged.
    assert api.post(f"/jobs/{cancelled}/cancel", headers=auth).json()["status"] == "running"
    queued_before = broker.llen("cpu.jax")

    assert runner.release(kept, 1) == "queued"
    assert runner.release(cancelled, 1) == "cancelled"
    kept_job, cancelled_job = (api.get(f"/jobs/{j}", headers=auth).json() for j in (kept, cancelled))
    assert kept_job["status"] == "queued" and kept_job["attempts"] == 0  # to resume elsewhere
    assert cancelled_job["status"] == "cancelled" and cancelled_job["finished_at"] is not None
    assert broker.llen("cpu.jax") == queued_before + 1  # only the kept job is sent again
