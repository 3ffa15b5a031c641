"""Webhooks through the whole service: a job trained by a real worker, its status changes POSTed by
the API process's dispatcher to a receiver on loopback (allowed here) that is down for its first
two attempts; each change arrives once, signed with the key's secret."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis

from app.client import ApiError
from app.webhooks import signing
from tests.app.webhook_receiver import Receiver
from tests.e2e.conftest import running_service, wait_for


@pytest.fixture(scope="module")
def hooked(database_url, redis_url, tmp_path_factory):
    redis.Redis.from_url(redis_url).flushdb()
    with running_service(database_url, redis_url, tmp_path_factory.mktemp("webhooks"), webhook_allow_private="1",
                         webhook_retry_base_s="0.2", webhook_poll_s="0.1") as svc:
        yield svc


def cli(service, key: str, *args: str) -> str:
    env = {**service.env, "TRAINHUB_API_URL": service.url, "TRAINHUB_API_KEY": key}
    done = subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_each_status_change_arrives_once_signed_after_the_receiver_was_down(hooked):
    key = hooked.new_key("hooks")
    secret = cli(hooked, key, "webhooks", "secret").strip().splitlines()[-1]
    assert secret.startswith("whsec_")
    with Receiver(down=2) as receiver, hooked.client(key) as client:
        job = {"id": cli(hooked, key, "submit", "--dataset", "digits", "--epochs", "2", "--batch-size", "64",
                         "--webhook-url", receiver.url).strip()}
        done = client.wait(job["id"], timeout_s=240)
        assert done["status"] == "succeeded", done["error"]
        wait_for(lambda: {d["status"] for d in client.deliveries(job["id"])} == {"delivered"}
                 and len(client.deliveries(job["id"])) == 3, timeout_s=60, what="every delivery delivered")
        got = receiver.delivered()
        failed = [r for r in receiver.received if r.answered != 204]

    assert [r.answered for r in failed] == [None, 503]  # dropped, then 503: down twice
    assert [r.event["event"] for r in got] == ["job.queued", "job.running", "job.succeeded"]  # once each, in order
    assert [r.event["job"]["status"] for r in got] == ["queued", "running", "succeeded"]
    final = got[-1].event["job"]
    assert final["id"] == job["id"] and final["result"] == done["result"] and len(final["metrics"]) == 2
    assert {a["name"] for a in final["artifacts"]} == {a["name"] for a in done["artifacts"]}
    assert "hostname" not in final["worker"]  # where it ran, not on which host
    for r in got:
        signing.verify(secret, r.headers["Trainhub-Signature"], r.body)
        assert r.headers["Trainhub-Delivery"] == r.event["id"] and r.headers["Trainhub-Event"] == r.event["event"]
    assert failed[0].body == failed[1].body == got[0].body  # each retry sent the same bytes

    listed = json.loads(cli(hooked, key, "deliveries", job["id"], "--json"))
    assert [(d["event"], d["attempts"], d["response_status"]) for d in listed] == [
        ("job.succeeded", 1, 204), ("job.running", 1, 204), ("job.queued", 3, 204)]
    with hooked.client() as other, pytest.raises(ApiError) as hidden:
        other.deliveries(job["id"])
    assert hidden.value.status_code == 404


def test_a_private_url_is_refused_where_the_deployment_does_not_allow_it(database_url, redis_url, tmp_path):
    with running_service(database_url, redis_url, tmp_path, workers=0) as svc, svc.client() as client:
        client.webhook_secret()
        with pytest.raises(ApiError) as refused:
            client.submit({"framework": "jax", "dataset": {"name": "digits"}, "webhook_url": "http://127.0.0.1:9/x"})
    assert refused.value.status_code == 422
    [error] = refused.value.detail
    assert error["loc"] == ["body", "webhook_url"] and "TRAINHUB_WEBHOOK_ALLOW_PRIVATE" in error["msg"]
