"""Fault injection against real PostgreSQL, a real (private) Redis and real worker processes:
nothing lost, nothing run twice."""

from __future__ import annotations

import signal
import time

import pytest
from sqlalchemy import create_engine, func, select

from sqlalchemy.engine import make_url

from app.models import Artifact, EpochMetric
from tests.e2e.conftest import wait_for, RedisServer, running_service
from tests.e2e.proxy import Proxy

# Short enough for a test, long enough for a heartbeat to be missed only when a worker is gone.
FAST_RECOVERY = {"heartbeat_s": "0.5", "worker_timeout_s": "3"}

# ~0.2 s an epoch on one core of this machine, so a kill lands mid-run.
SLOW = {"dataset": {"name": "fashion-mnist", "train_limit": 6000, "test_limit": 2000}, "batch_size": 32}
DIGITS = {"dataset": {"name": "digits"}, "batch_size": 64}




@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def database_link(database_url):
    """The API's way to PostgreSQL, through a proxy the tests can cut."""
    url = make_url(database_url)
    proxy = Proxy(url.host or "127.0.0.1", url.port or 5432)
    proxy.start()
    yield proxy, url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    proxy.stop()


@pytest.fixture(scope="module")
def faults(database_url, broker, database_link, tmp_path_factory):
    """The API and two cpu workers on the private Redis, with quick worker-loss detection."""
    with running_service(database_url, broker.url, tmp_path_factory.mktemp("faults"), workers=2,
                         api_database_url=database_link[1], **FAST_RECOVERY) as svc:
        svc.admin_key = svc.new_key("ops", admin=True)  # made before any job: it takes a process start
        yield svc


def kill_worker_running(service, client, job_id: str) -> int:
    """kill -9 the worker process that runs `job_id`; the core it was pinned to."""
    workers = [p for p in service.stack.processes[1:] if p.poll() is None]
    with service.client(service.admin_key) as ops:  # only an admin key sees the pid
        pid = ops.get(job_id)["worker"]["pid"]
    victim = next(p for p in workers if p.pid == pid)
    core = pinned_core(victim)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    return core


def pinned_core(process) -> int:
    return int(process.args[process.args.index("--devices") + 1])


def restart_worker(service, core: int):
    """A worker comes back on its core, as a supervisor would restart it."""
    return service.start_worker("--hardware", "cpu", "--devices", str(core))


@pytest.mark.parametrize("framework,epochs", [("pytorch", 6), ("jax", 12)])
def test_kill_9_mid_epoch_resumes_from_checkpoint_with_identical_results(faults, framework, epochs):
    spec = {**SLOW, "framework": framework, "epochs": epochs}
    with faults.client() as client:
        whole = client.wait(client.submit(spec)["id"], timeout_s=240)
        assert whole["status"] == "succeeded", whole["error"]

        job = client.submit(spec)
        wait_for(lambda: client.get(job["id"])["progress"]["epoch"] >= 2, 120, "two epochs")
        restart_worker(faults, kill_worker_running(faults, client, job["id"]))
        job = client.wait(job["id"], timeout_s=240)

    assert job["status"] == "succeeded", job["error"]
    assert job["attempts"] == 2 and job["retries"] == 1 and job["last_error"]["type"] == "worker_lost"
    assert [m["epoch"] for m in job["metrics"]] == list(range(1, epochs + 1))
    for name in ("test_accuracy", "test_loss"):
        assert job["result"][name] == pytest.approx(whole["result"][name], abs=1e-6)
    for a, b in zip(job["metrics"], whole["metrics"]):
        assert a["train_loss"] == pytest.approx(b["train_loss"], abs=1e-6)
    assert len(job["artifacts"]) == 4


def test_redis_restart_while_a_job_runs_and_others_wait(faults, broker):
    with faults.client() as client:
        jobs = [client.submit({**SLOW, "framework": "pytorch", "epochs": 3}) for _ in range(3)]
        wait_for(lambda: client.get(jobs[0]["id"])["status"] == "running", 60, "the first job to start")
        broker.stop()  # every queued message is gone with it
        time.sleep(1)
        broker.start()
        finished = [client.wait(job["id"], timeout_s=240) for job in jobs]
    assert [job["status"] for job in finished] == ["succeeded"] * 3
    assert all(len(job["metrics"]) == 3 for job in finished)


def test_submit_while_redis_is_down_is_accepted_and_runs_when_it_returns(faults, broker):
    with faults.client() as client:
        broker.stop()
        try:
            started = time.monotonic()
            job = client.submit({**DIGITS, "framework": "jax", "epochs": 1})
            assert time.monotonic() - started < 10  # answered, not hung on the broker
            assert client.get(job["id"])["status"] == "queued"
        finally:
            broker.start()
        job = client.wait(job["id"], timeout_s=120)
    assert job["status"] == "succeeded"
    assert job["attempts"] == 1


def test_database_outage_answers_503_and_recovers_by_itself(faults, database_link):
    import httpx

    proxy, _ = database_link
    with faults.client() as client:
        before = client.submit({**DIGITS, "framework": "jax", "epochs": 1})
        proxy.stop()
        try:
            ready = httpx.get(f"{faults.url}/readyz", timeout=30)
            assert ready.status_code == 503
            assert ready.json()["checks"]["database"].startswith("unreachable")
            for response in (client.http.post("/jobs", json={**DIGITS, "framework": "jax"}),
                             client.http.get(f"/jobs/{before['id']}")):
                assert response.status_code == 503, response.text
                assert "database is unavailable" in response.json()["detail"]
            assert httpx.get(f"{faults.url}/healthz").status_code == 200
        finally:
            proxy.start()
        wait_for(lambda: httpx.get(f"{faults.url}/readyz", timeout=30).status_code == 200, 60, "readiness")
        after = client.wait(client.submit({**DIGITS, "framework": "jax", "epochs": 1})["id"], timeout_s=120)
        assert after["status"] == "succeeded"
        assert client.wait(before["id"], timeout_s=120)["status"] == "succeeded"


def test_a_cancelled_queued_job_never_runs_even_after_workers_restart(faults):
    with faults.client() as client:
        blockers = [client.submit({**SLOW, "framework": "pytorch", "epochs": 3}) for _ in range(2)]
        job = client.submit({**DIGITS, "framework": "pytorch", "epochs": 1})
        assert client.cancel(job["id"])["status"] == "cancelled"
        for process in [p for p in faults.stack.processes[1:] if p.poll() is None]:
            process.send_signal(signal.SIGKILL)
            process.wait()
            restart_worker(faults, pinned_core(process))
        for blocker in blockers:
            assert client.wait(blocker["id"], timeout_s=240)["status"] == "succeeded"
        job = client.get(job["id"])
    assert job["status"] == "cancelled"
    assert job["attempts"] == 0 and job["started_at"] is None and job["metrics"] == []


def test_max_runtime_fails_as_timeout_keeping_partial_metrics(faults):
    # (a fresh worker imports torch within the job: the limit leaves room for that and an epoch)
    with faults.client() as client:
        job = client.submit({**DIGITS, "framework": "pytorch", "epochs": 1000, "batch_size": 16, "max_runtime_s": 10})
        job = client.wait(job["id"], timeout_s=120)
    assert job["status"] == "failed"
    assert job["error"]["type"] == "timeout"
    assert "max_runtime_s=10" in job["error"]["message"]
    assert 1 <= len(job["metrics"]) < 1000


def test_a_diverging_learning_rate_fails_as_nan_loss(faults):
    spec = {**DIGITS, "framework": "jax", "epochs": 3, "optimizer": {"learning_rate": 1e4},
            "model": {"hidden_sizes": [256] * 8}}
    with faults.client() as client:
        job = client.wait(client.submit(spec)["id"], timeout_s=120)
    assert job["status"] == "failed"
    assert job["error"]["type"] == "nan_loss"
    assert "in epoch 1" in job["error"]["message"]


def test_fifty_jobs_through_two_workers_while_one_is_killed_and_restarted(faults, database_url):
    workers = [p for p in faults.stack.processes[1:] if p.poll() is None]
    assert sorted(pinned_core(p) for p in workers) == [0, 1]
    with faults.client() as client:
        ids = [client.submit({**DIGITS, "framework": fw, "epochs": 2, "seed": i})["id"]
               for i, fw in zip(range(50), ["jax", "pytorch"] * 25)]
        wait_for(lambda: sum(client.get(i)["status"] == "succeeded" for i in ids[:20]) >= 10, 240, "10 jobs")
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait()
        restart_worker(faults, pinned_core(workers[0]))
        finished = [client.wait(i, timeout_s=300) for i in ids]
    assert [job["status"] for job in finished] == ["succeeded"] * 50
    engine = create_engine(database_url)
    with engine.connect() as connection:
        metric_rows = dict(connection.execute(select(EpochMetric.job_id, func.count()).where(
            EpochMetric.job_id.in_(ids)).group_by(EpochMetric.job_id)).all())
        artifact_rows = dict(connection.execute(select(Artifact.job_id, func.count()).where(
            Artifact.job_id.in_(ids)).group_by(Artifact.job_id)).all())
    engine.dispose()
    assert metric_rows == {i: 2 for i in ids}
    assert artifact_rows == {i: 4 for i in ids}
