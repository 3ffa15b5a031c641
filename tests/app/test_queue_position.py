"""A queued job's place in its queue `<hardware>.<framework>`, counted from the jobs table."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

TPU_TORCH = {"framework": "pytorch", "hardware": "tpu", "dataset": {"name": "digits"}}


@pytest.fixture
def serve(services_env):
    """`serve(queue)`: a fresh heartbeat of a worker serving `queue`, removed after the test (the
    database is shared: other tests must not see it online)."""
    from sqlalchemy import delete

    from app.db import session_scope
    from app.jobs import forget_online_queues
    from app.models import Worker, utcnow

    names = []

    def add(queue: str) -> None:
        names.append(f"pos-{queue}:1")
        with session_scope() as session:
            session.add(Worker(name=names[-1], hostname="pos", hardware=queue.split(".")[0], queues=[queue],
                               devices=[], versions={}, started_at=utcnow() - timedelta(minutes=1), last_seen=utcnow()))
            session.commit()
        forget_online_queues()  # what the API sees within ONLINE_QUEUES_TTL_S

    yield add
    with session_scope() as session:
        session.execute(delete(Worker).where(Worker.name.in_(names)))
        session.commit()


def test_position_counts_the_queued_jobs_ahead_in_the_same_queue(api, auth, rows, serve):
    jobs = [api.post("/jobs", json={**TPU_TORCH, "seed": seed}, headers=auth).json() for seed in range(3)]
    api.post("/jobs", json={**TPU_TORCH, "framework": "jax"}, headers=auth)  # another queue: not counted
    first = jobs[0]["queue_position"]
    assert first >= 1  # other tests' jobs may wait on tpu.pytorch too
    assert [j["queue_position"] for j in jobs] == [first, first + 1, first + 2]
    assert jobs[0]["waiting_reason"] == "no online worker serves tpu.pytorch"

    api.post(f"/jobs/{jobs[0]['id']}/cancel", headers=auth)
    rows.start(jobs[1]["id"])
    cancelled, running, last = (api.get(f"/jobs/{j['id']}", headers=auth).json() for j in jobs)
    assert cancelled["queue_position"] is None and running["queue_position"] is None
    assert last["queue_position"] == first

    serve("tpu.pytorch")
    last = api.get(f"/jobs/{jobs[2]['id']}", headers=auth).json()
    assert last["waiting_reason"] == f"waiting for a free worker on tpu.pytorch ({first - 1} job(s) ahead)"
    listed = {j["id"]: j for j in api.get("/jobs", headers=auth).json()["items"]}
    assert listed[jobs[2]["id"]]["queue_position"] == first


def test_a_data_parallel_job_has_its_own_queue_and_waits_for_a_worker_owning_its_devices(api, auth, serve):
    two = {"framework": "jax", "hardware": "gpu", "dataset": {"name": "digits"}, "devices": 2}
    one_device = api.post("/jobs", json={**two, "devices": 1}, headers=auth).json()
    jobs = [api.post("/jobs", json={**two, "seed": seed}, headers=auth).json() for seed in range(2)]
    assert jobs[1]["queue_position"] == jobs[0]["queue_position"] + 1  # counted in gpu.jax.x2 only
    assert jobs[0]["waiting_reason"] == (
        "no online worker owns 2 gpu devices for jax (queue gpu.jax.x2); start one with "
        "`trainhub worker --hardware gpu --devices 0,1`")

    serve("gpu.jax")  # a one-device worker: the one-device job may run, the others still wait
    assert api.get(f"/jobs/{one_device['id']}", headers=auth).json()["waiting_reason"].startswith(
        "waiting for a free worker on gpu.jax ")
    assert api.get(f"/jobs/{jobs[0]['id']}", headers=auth).json()["waiting_reason"].startswith(
        "no online worker owns 2 gpu devices")
    queues = {q["name"]: q for q in api.get("/workers", headers=auth).json()["queues"]}
    assert queues["gpu.jax.x2"]["depth"] >= 2 and queues["gpu.jax.x2"]["workers_online"] == 0

    serve("gpu.jax.x2")
    waiting = api.get(f"/jobs/{jobs[1]['id']}", headers=auth).json()["waiting_reason"]
    assert waiting == f"waiting for a free worker on gpu.jax.x2 ({jobs[1]['queue_position'] - 1} job(s) ahead)"
    for job in (one_device, *jobs):
        api.post(f"/jobs/{job['id']}/cancel", headers=auth)


def test_a_worker_coming_online_is_seen_within_the_online_queues_ttl(api, auth, rows, monkeypatch):
    """Polls reuse which queues have a live worker for ONLINE_QUEUES_TTL_S, then read it again."""
    from app import jobs
    from app.db import session_scope
    from app.models import Worker, utcnow

    monkeypatch.setattr(jobs, "ONLINE_QUEUES_TTL_S", 0.3)
    job = api.post("/jobs", json={**TPU_TORCH, "framework": "jax", "devices": 4}, headers=auth).json()
    assert job["waiting_reason"].startswith("no online worker owns 4 tpu devices")
    name = "ttl-tpu:1"
    with session_scope() as session:
        session.add(Worker(name=name, hostname="ttl", hardware="tpu", queues=["tpu.jax.x4"], devices=[], versions={},
                           started_at=utcnow(), last_seen=utcnow()))
        session.commit()
    try:
        time.sleep(0.4)
        seen = api.get(f"/jobs/{job['id']}", headers=auth).json()["waiting_reason"]
        assert seen.startswith("waiting for a free worker on tpu.jax.x4")
    finally:
        from sqlalchemy import delete

        with session_scope() as session:
            session.execute(delete(Worker).where(Worker.name == name))
            session.commit()
        api.post(f"/jobs/{job['id']}/cancel", headers=auth)
