"""Within a queue the next job is taken fairly across keys (app/scheduling.py), queue positions
and waiting reasons say where a job really stands, and a message is a turn in its queue that
the reconciler counts as such. Real PostgreSQL and Redis; the worker is runner.claim/finish."""

from __future__ import annotations

from datetime import timedelta

import pytest
import redis
from sqlalchemy import select, text, update

DIGITS = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1}
WORKER = {"name": "test:fair", "hostname": "test", "hardware": "cpu", "devices": ["cpu:0"], "versions": {}}


@pytest.fixture(autouse=True)
def no_waiting_jobs(services_env):
    """Only this test's jobs wait: earlier tests' are ended."""
    from app.db import session_scope

    with session_scope() as session:
        session.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status IN ('queued', 'running')"))
        session.commit()


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def submit(api, headers: dict, count: int, **spec) -> list[str]:
    return [api.post("/jobs", json={**DIGITS, **spec, "seed": i}, headers=headers).json()["id"] for i in range(count)]


def run_one(turn_of: str) -> str:
    """One worker takes the turn of `turn_of`'s message, runs the job it claims to the end."""
    from app import lifecycle
    from app.db import session_scope
    from app.lifecycle import JobStatus
    from workers import runner

    claimed = runner.claim(turn_of, WORKER)
    assert claimed is not None
    job_id, _, attempt = claimed
    with session_scope() as session:
        assert lifecycle.finish(session, job_id, attempt, JobStatus.SUCCEEDED)
    return job_id


def test_one_keys_many_jobs_do_not_hold_the_queue_and_positions_tell_the_order(api, make_key):
    alice, bob = bearer(make_key("alice")), bearer(make_key("bob"))
    hers = submit(api, alice, 4)
    his = submit(api, bob, 2)  # after all of hers
    # Before any runs: her first, his first, her second, his second, then the rest of hers.
    expected = [hers[0], his[0], hers[1], his[1], hers[2], hers[3]]
    positions = {job_id: api.get(f"/jobs/{job_id}", headers=alice if job_id in hers else bob).json()
                 for job_id in hers + his}
    assert sorted(expected, key=lambda j: positions[j]["queue_position"]) == expected
    assert [positions[j]["queue_position"] for j in expected] == [1, 2, 3, 4, 5, 6]
    assert positions[his[1]]["waiting_reason"] in (
        "no online worker serves cpu.jax", "waiting for a free worker on cpu.jax (3 job(s) ahead)")

    # One worker, every message's turn in order of arrival (all of hers first): fair all the same.
    ran = [run_one(turn_of) for turn_of in hers + his]
    assert ran == expected


def test_a_key_running_a_job_waits_behind_keys_running_none(api, make_key):
    alice, bob = bearer(make_key("alice")), bearer(make_key("bob"))
    hers = submit(api, alice, 3)
    from workers import runner

    first = runner.claim(hers[0], WORKER)  # her first job runs on one worker, and goes on running
    assert first is not None and first[0] == hers[0]
    his = submit(api, bob, 1)
    assert api.get(f"/jobs/{his[0]}", headers=bob).json()["queue_position"] == 1
    assert api.get(f"/jobs/{hers[1]}", headers=alice).json()["queue_position"] == 2
    second = runner.claim(hers[1], {**WORKER, "name": "test:fair2"})  # her message, his turn
    assert second is not None and second[0] == his[0]


def test_queues_are_shared_fairly_each_on_its_own(api, make_key):
    alice, bob = bearer(make_key("alice")), bearer(make_key("bob"))
    hers = submit(api, alice, 2)
    his_torch = submit(api, bob, 1, framework="pytorch")
    # Another queue's jobs neither go first nor count ahead.
    assert api.get(f"/jobs/{hers[0]}", headers=alice).json()["queue_position"] == 1
    assert api.get(f"/jobs/{his_torch[0]}", headers=bob).json()["queue_position"] == 1
    assert run_one(hers[1]) == hers[0]
    assert run_one(his_torch[0]) == his_torch[0]


def test_a_stale_message_takes_a_waiting_jobs_turn_and_the_last_one_finds_none(api, auth):
    cancelled, waiting = submit(api, auth, 2)
    api.post(f"/jobs/{cancelled}/cancel", headers=auth)
    assert run_one(cancelled) == waiting  # the cancelled job's message is still a turn
    from workers import runner

    assert runner.run(waiting, WORKER, serves=["cpu.jax"]) == "skipped"  # no job waits: nothing runs


def test_the_reconciler_counts_a_spare_turn_and_resends_only_what_no_turn_covers(api, make_key, services_env):
    from app.db import session_scope
    from app.models import Job
    from workers import reconciler, runner

    alice, bob = bearer(make_key("alice")), bearer(make_key("bob"))
    hers = submit(api, alice, 2)
    his = submit(api, bob, 1)
    client = redis.Redis.from_url(services_env["TRAINHUB_BROKER_URL"])
    with session_scope() as session:  # sent long enough ago that their messages must be there
        session.execute(update(Job).where(Job.id.in_(hers + his)).values(
            enqueued_at=Job.enqueued_at - timedelta(seconds=reconciler.MESSAGE_GRACE_S + 1)))
        session.commit()
    # A worker takes her second job's message and claims the job next in turn, her first: her
    # second job keeps no message of its own, and her first's (still in the list) is spare.
    taken = client.lrem("cpu.jax", 1, next(m for m in client.lrange("cpu.jax", 0, -1) if hers[1].encode() in m))
    assert taken == 1
    assert runner.claim(hers[1], WORKER)[0] == hers[0]  # her first is older: its turn comes first
    reconciler.resend_lost_messages()
    # Queued: her second (no message). Waiting in the list: her first's (running) and his (queued).
    # Her first's message is a spare turn that will claim her second: nothing is sent again.
    assert client.llen("cpu.jax") == 2
    client.delete(reconciler.SCAN_LOCK)

    client.delete("cpu.jax")  # the broker loses both: now two queued jobs have no turn at all
    reconciler.resend_lost_messages()
    messages = client.lrange("cpu.jax", 0, -1)
    assert len(messages) == 2
    with session_scope() as session:
        queued = set(session.scalars(select(Job.id).where(Job.status == "queued")))
    assert queued == {hers[1], his[0]}
    assert all(any(job_id.encode() in m for m in messages) for job_id in queued)


def test_priorities_come_first_and_the_fair_share_holds_within_a_level(api, make_key):
    alice, bob = bearer(make_key("alice")), bearer(make_key("bob"))
    low = submit(api, alice, 1, priority="low")
    normal = submit(api, alice, 2)
    high = submit(api, bob, 1, priority="high")
    order = [*high, *normal, *low]
    positions = [api.get(f"/jobs/{j}", headers=bob if j in high else alice).json()["queue_position"] for j in order]
    assert positions == [1, 2, 3, 4]
    assert [run_one(low[0]) for _ in order] == order  # any message's turn takes the highest level first


def test_a_job_list_gives_each_queued_job_the_place_its_own_page_gives(api, make_key):
    """A list reads the positions a queue and level at a time (scheduling.positions): the same
    places as GET /jobs/{id}, and in each queue every place from 1 up once."""
    keys = {name: bearer(make_key(name)) for name in ("alice", "bob", "carol")}
    admin = bearer(make_key("ops", admin=True))
    owner: dict[str, str] = {}
    for name, count, spec in [
        ("alice", 4, {}), ("bob", 2, {}), ("carol", 3, {"framework": "pytorch"}), ("alice", 2, {"priority": "high"}),
        ("bob", 3, {"priority": "low"}), ("carol", 2, {}), ("alice", 1, {"framework": "pytorch"}),
    ]:
        owner.update(dict.fromkeys(submit(api, keys[name], count, **spec), name))
    from workers import runner

    assert runner.claim(next(iter(owner)), WORKER) is not None  # alice's first high job runs: she goes last
    alone = {job: api.get(f"/jobs/{job}", headers=keys[name]).json() for job, name in owner.items()}
    listed = {job["id"]: job for headers in keys.values() for job in api.get("/jobs", headers=headers).json()["items"]}
    everyone = api.get("/jobs?status=queued&limit=200", headers=admin).json()["items"]
    assert {job: listed[job]["queue_position"] for job in owner} == {job: alone[job]["queue_position"] for job in owner}
    assert {job["id"]: job["queue_position"] for job in everyone if job["id"] in owner} == {
        job: place["queue_position"] for job, place in alone.items() if place["status"] == "queued"}
    for framework in ("jax", "pytorch"):
        places = [job["queue_position"] for job in alone.values()
                  if job["status"] == "queued" and job["spec"]["framework"] == framework]
        assert sorted(places) == list(range(1, len(places) + 1))
    assert {job: listed[job]["waiting_reason"] for job in owner} == {job: alone[job]["waiting_reason"] for job in owner}


def test_a_key_capped_at_a_priority_cannot_ask_for_more(api, services_env):
    from app.db import session_scope
    from app.keys import create_key

    with session_scope() as session:
        capped = bearer(create_key(session, "capped", max_priority="normal")[1])
    refused = api.post("/jobs", json={**DIGITS, "priority": "high"}, headers=capped)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "priority"] and "cap of normal" in refused.text
    assert api.post("/jobs", json={**DIGITS, "priority": "normal"}, headers=capped).status_code == 201
    assert api.post("/comparisons", json={"dataset": {"name": "digits"}, "priority": "high"},
                    headers=capped).status_code == 422


def beat(name: str, queues: list[str], current_job_id: str | None) -> None:
    from app.db import session_scope
    from app.models import Worker, utcnow

    with session_scope() as session:
        session.merge(Worker(name=name, hostname="host", hardware="cpu", queues=queues, devices=["cpu:0"],
                             versions={}, current_job_id=current_job_id, last_seen=utcnow(), broker_ok=True))
        session.commit()


@pytest.fixture
def no_heartbeats(services_env):
    """No workers' heartbeats but this test's, before and after it."""
    from app.db import session_scope

    def clear() -> None:
        with session_scope() as session:
            session.execute(text("DELETE FROM workers"))
            session.commit()

    clear()
    yield
    clear()


def test_a_waiting_high_job_takes_the_worker_of_the_latest_low_job_only_when_no_worker_is_free(
    api, auth, no_heartbeats
):
    from app import scheduling
    from app.db import session_scope
    from app.models import Job, Worker, utcnow
    from workers import runner

    first, second = submit(api, auth, 2, priority="low")
    for job_id, worker in ((first, "w:1"), (second, "w:2")):
        assert runner.claim(job_id, {**WORKER, "name": worker})[0] == job_id
        beat(worker, ["cpu.jax", "cpu.pytorch"], job_id)

    def yields(job_id: str) -> str | None:
        with session_scope() as session:
            job = session.get(Job, job_id)
            running = scheduling.Running(job.id, job.priority, job.started_at)
            return scheduling.preempting(session, running, "cpu", ["cpu.jax", "cpu.pytorch"],
                                         utcnow() - timedelta(seconds=30))

    assert yields(first) is None and yields(second) is None  # nothing waits
    (normal,) = submit(api, auth, 1, framework="pytorch")  # served by the same workers
    assert yields(first) is None and yields(second) == normal  # the later started goes, once
    beat("w:3", ["cpu.pytorch"], None)  # a free worker will take it: nobody yields
    assert yields(second) is None
    with session_scope() as session:
        session.execute(text("DELETE FROM workers WHERE name = 'w:3'"))
        session.commit()
    # The job that yielded is back in the queue (preempted once); its worker counts as free now.
    with session_scope() as session:
        job = session.get(Job, second)
        from app import lifecycle

        assert lifecycle.preempt(session, second, job.attempts) == "queued"
    assert yields(first) is None
    with session_scope() as session:
        job = session.get(Job, second)
        assert job.status == "queued" and job.preempted == 1 and job.attempts == 0
        assert session.get(Worker, "w:2") is not None


def test_keys_are_capped_and_uncapped_from_the_cli(api, services_env):
    from typer.testing import CliRunner

    from app.cli import cli

    runner = CliRunner()
    created = runner.invoke(cli, ["keys", "create", "--name", "team", "--max-priority", "low"])
    assert created.exit_code == 0, created.output
    key = bearer(created.output.strip().splitlines()[-1])
    assert api.post("/jobs", json={**DIGITS, "priority": "normal"}, headers=key).status_code == 422
    # naming no priority, a key capped below normal submits at its cap
    unnamed = api.post("/jobs", json=DIGITS, headers=key)
    assert unnamed.status_code == 201 and unnamed.json()["spec"]["priority"] == "low"
    compared = api.post("/comparisons", json={"dataset": {"name": "digits"}, "epochs": 1}, headers=key)
    assert compared.status_code == 201 and compared.json()["spec"]["priority"] == "low"
    swept = api.post("/sweeps", json={"base": DIGITS, "space": {"batch_size": {"choice": [32, 64]}},
                                      "max_trials": 2, "parallelism": 1}, headers=key)
    assert swept.status_code == 201 and swept.json()["spec"]["base"]["priority"] == "low"
    prefix = created.output.strip().splitlines()[-1][:10]
    capped = runner.invoke(cli, ["keys", "cap", prefix, "--max-priority", "normal"])
    assert capped.exit_code == 0 and "capped at priority normal" in capped.output
    assert api.post("/jobs", json={**DIGITS, "priority": "normal"}, headers=key).status_code == 201
    assert api.post("/jobs", json={**DIGITS, "priority": "high"}, headers=key).status_code == 422
    lifted = runner.invoke(cli, ["keys", "cap", prefix])
    assert lifted.exit_code == 0 and "no longer capped" in lifted.output
    assert api.post("/jobs", json={**DIGITS, "priority": "high"}, headers=key).status_code == 201
    assert runner.invoke(cli, ["keys", "cap", "th_nosuch"]).exit_code == 1


def test_submit_priority_sets_the_spec_field():
    from app.cli import spec_from_options

    assert spec_from_options(None, priority="high", epochs=2) == {"priority": "high", "epochs": 2}


def test_a_keys_first_job_is_told_its_place_behind_keys_served_longer_ago(api, make_key):
    alice, bob = bearer(make_key("alice")), bearer(make_key("bob"))
    (first,) = submit(api, alice, 1)
    assert run_one(first) == first  # alice was served just now
    (hers,) = submit(api, alice, 1)
    (his,) = submit(api, bob, 1)  # never served: he goes first, and is told so at once
    assert api.get(f"/jobs/{his}", headers=bob).json()["queue_position"] == 1
    late = api.post("/jobs", json={**DIGITS, "seed": 9}, headers=alice).json()
    assert late["queue_position"] == 3  # at submit: behind his, and behind her own earlier one
    assert api.get(f"/jobs/{hers}", headers=alice).json()["queue_position"] == 2


def test_a_worker_shutting_down_claims_nothing_and_gives_the_turn_back(api, auth, services_env):
    from workers import runner

    (job_id,) = submit(api, auth, 1)
    client = redis.Redis.from_url(services_env["TRAINHUB_BROKER_URL"])
    before = client.llen("cpu.jax")
    runner.shutting_down.set()
    try:
        assert runner.run(job_id, WORKER, serves=["cpu.jax"]) == "skipped"
    finally:
        runner.shutting_down.clear()
    assert api.get(f"/jobs/{job_id}", headers=auth).json()["status"] == "queued"
    assert client.llen("cpu.jax") == before + 1  # the turn is back for another worker


def test_progress_never_goes_back_when_a_resumed_job_replays_an_epoch(api, auth):
    from app import lifecycle
    from app.db import session_scope
    from app.models import Job, utcnow

    (job_id,) = submit(api, auth, 1)
    with session_scope() as session:
        attempt = lifecycle.claim(session, job_id, {"name": "w"}, utcnow())
        assert lifecycle.record_epoch(session, job_id, attempt, 3)
        assert lifecycle.record_epoch(session, job_id, attempt, 2)  # replayed after a checkpoint of epoch 1
        assert session.get(Job, job_id).epoch == 3
