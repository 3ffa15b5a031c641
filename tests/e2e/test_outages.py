"""A worker's way to the database goes down mid-job (issue 15, item 6), and what a failed job
shows its user (item 2): real PostgreSQL (behind a proxy the test cuts), a private Redis, real
API and worker processes."""

from __future__ import annotations

import json
import time

import pytest
from sqlalchemy.engine import make_url

from tests.e2e.conftest import RedisServer, running_service, wait_for
from tests.e2e.proxy import Proxy

# ~0.1-0.3 s an epoch: an outage of a few seconds lands mid-run.
STEADY = {"framework": "pytorch", "dataset": {"name": "digits"}, "batch_size": 16, "epochs": 30}


@pytest.fixture(scope="module")
def outage(database_url, tmp_path_factory):
    """The API on PostgreSQL directly; its one worker through a proxy the tests cut."""
    broker = RedisServer(tmp_path_factory.mktemp("redis"))
    broker.start()
    url = make_url(database_url)
    proxy = Proxy(url.host or "127.0.0.1", url.port or 5432)
    proxy.start()
    through_proxy = url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)
    with running_service(database_url, broker.url, tmp_path_factory.mktemp("outage"), workers=0,
                         heartbeat_s="0.5", worker_timeout_s="4", db_retry_s="20") as svc:
        svc.env = {**svc.env, "TRAINHUB_DATABASE_URL": through_proxy}
        svc.start_worker("--hardware", "cpu")
        yield svc, proxy
    proxy.stop()
    broker.stop()


def test_a_database_outage_mid_job_is_waited_out_and_each_epoch_recorded_once(outage):
    service, proxy = outage
    with service.client() as client:
        wait_for(lambda: any(w["online"] for w in client.workers()["workers"]), 60, "the worker")
        job = client.submit(STEADY)
        wait_for(lambda: client.get(job["id"])["progress"]["epoch"] >= 2, 120, "two epochs")
        proxy.stop()
        time.sleep(4)
        proxy.start()
        job = client.wait(job["id"], timeout_s=240)
    assert job["status"] == "succeeded", job["error"]
    assert job["attempts"] == 1
    assert [m["epoch"] for m in job["metrics"]] == list(range(1, 31))
    assert len(job["artifacts"]) == 4


def test_an_outage_longer_than_the_retries_never_leaves_the_job_running(outage):
    """The worker gives up its writes after db_retry_s (20 s here) and hands the job back once the
    database answers (or, if it cannot, the reconciler requeues it when the worker reports another
    job); it resumes from its checkpoint."""
    service, proxy = outage
    with service.client() as client:
        job = client.submit({**STEADY, "epochs": 60})
        wait_for(lambda: client.get(job["id"])["progress"]["epoch"] >= 2, 120, "two epochs")
        proxy.stop()
        time.sleep(25)
        proxy.start()
        job = client.wait(job["id"], timeout_s=300)
    assert job["status"] == "succeeded", job["error"]
    assert [m["epoch"] for m in job["metrics"]] == list(range(1, 61))


def test_a_diverging_job_fails_as_nan_loss_with_strict_json_everywhere(outage):
    service, _ = outage
    spec = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1, "batch_size": 128,
            "model": {"hidden_sizes": [512] * 6}, "optimizer": {"name": "adam", "learning_rate": 2000}}
    with service.client() as client:
        job = client.wait(client.submit(spec)["id"], timeout_s=120)
        raw = client.http.get(f"/jobs/{job['id']}").text
    assert job["status"] == "failed"
    assert job["error"]["type"] == "nan_loss"
    assert "epoch 1" in job["error"]["message"] and "_loss became" in job["error"]["message"]
    json.loads(raw, parse_constant=lambda token: pytest.fail(f"{token} in the API's JSON"))
    assert "SQL" not in job["error"]["message"] and "Error" not in job["error"]["message"]
    assert all(a["name"] != "metrics.json" for a in job["artifacts"])
