"""GET /workers: heartbeat rows read as online or not, and queue depths from queued jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest

_ADDED: list[str] = []


@pytest.fixture(autouse=True)
def forget_heartbeats(services_env):
    """The database is shared: later tests must not see these workers online."""
    yield
    from sqlalchemy import delete

    from app.db import session_scope
    from app.models import Worker

    with session_scope() as session:
        session.execute(delete(Worker).where(Worker.name.in_(_ADDED)))
        session.commit()
    _ADDED.clear()


def heartbeat(name: str, seconds_ago: float, queues: list[str], current_job_id: str | None = None) -> None:
    from app.db import session_scope
    from app.models import Worker, utcnow

    seen = utcnow() - timedelta(seconds=seconds_ago)
    _ADDED.append(name)
    with session_scope() as session:
        session.add(Worker(name=name, hostname=name.split(":")[0], hardware=queues[0].split(".")[0], queues=queues,
                           devices=["cpu:0"], versions={"jax": "0.4.30"}, current_job_id=current_job_id,
                           started_at=seen - timedelta(minutes=5), last_seen=seen))
        session.commit()


def test_workers_online_offline_and_queue_depths(api, auth, make_key, rows):
    # The database is shared by the session's tests: look only at this test's workers, and at
    # queue depths as differences.
    depth_before = {q["name"]: q for q in api.get("/workers", headers=auth).json()["queues"]}
    mine = api.post("/jobs", json={"framework": "jax", "dataset": {"name": "digits"}}, headers=auth).json()
    theirs_key = {"Authorization": f"Bearer {make_key('other')}"}
    theirs = api.post("/jobs", json={"framework": "jax", "dataset": {"name": "digits"}}, headers=theirs_key).json()
    api.post("/jobs", json={"framework": "pytorch", "hardware": "tpu"}, headers=theirs_key)
    done = api.post("/jobs", json={"framework": "jax", "dataset": {"name": "digits"}}, headers=auth).json()
    for job in (mine, theirs, done):
        rows.start(job["id"])
    rows.finish(done["id"])
    for seed in (1, 2):  # two jobs left waiting on cpu.jax
        api.post("/jobs", json={"framework": "jax", "dataset": {"name": "digits"}, "seed": seed}, headers=auth)
    heartbeat("wa:1", 2, ["tpu.jax", "tpu.pytorch"], current_job_id=mine["id"])
    heartbeat("wb:2", 3, ["tpu.jax"], current_job_id=theirs["id"])
    heartbeat("wc:3", 600, ["tpu.pytorch"])                   # stopped beating ten minutes ago
    heartbeat("we:5", 1, ["tpu.jax"], current_job_id=done["id"])  # its last beat was before the job ended
    heartbeat("wd:4", 3 * 24 * 3600, ["tpu.jax"])             # long gone: not listed

    response = api.get("/workers", headers=auth)
    assert response.status_code == 200, response.text
    body = response.json()
    # A user key sees each worker by a stable alias, never its host or process.
    from app.rendering import worker_alias

    names = {worker_alias(name): name for name in ("wa:1", "wb:2", "wc:3", "wd:4", "we:5")}
    workers = {names[w["name"]]: w for w in body["workers"] if w["name"] in names}
    assert all(w["hostname"] is None for w in body["workers"])
    assert list(workers) == ["we:5", "wa:1", "wb:2", "wc:3"]  # online first, then most recent
    assert [workers[n]["online"] for n in workers] == [True, True, True, False]
    assert not workers["we:5"]["busy"] and workers["we:5"]["current_job_id"] is None
    assert workers["wa:1"]["queues"] == ["tpu.jax", "tpu.pytorch"] and workers["wa:1"]["hardware"] == "tpu"
    assert workers["wa:1"]["devices"] == ["cpu:0"] and workers["wa:1"]["versions"] == {"jax": "0.4.30"}
    assert workers["wa:1"]["busy"] and workers["wa:1"]["current_job_id"] == mine["id"]
    # another user's job is not named
    assert workers["wb:2"]["busy"] and workers["wb:2"]["current_job_id"] is None
    assert not workers["wc:3"]["busy"]
    online = [w["online"] for w in body["workers"]]
    assert online == sorted(online, reverse=True)
    queues = {q["name"]: q for q in body["queues"]}
    assert set(queues) >= {"cpu.jax", "cpu.pytorch", "gpu.jax", "gpu.pytorch", "tpu.jax", "tpu.pytorch"}
    assert queues["cpu.jax"]["depth"] - depth_before["cpu.jax"]["depth"] == 2
    assert queues["tpu.pytorch"]["depth"] - depth_before["tpu.pytorch"]["depth"] == 1
    assert queues["tpu.jax"]["workers_online"] - depth_before["tpu.jax"]["workers_online"] == 3
    assert queues["tpu.pytorch"]["workers_online"] - depth_before["tpu.pytorch"]["workers_online"] == 1


def test_workers_needs_a_key(api):
    assert api.get("/workers").status_code == 401
