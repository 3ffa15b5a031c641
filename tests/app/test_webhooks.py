"""Webhooks: which URLs are refused, the signature, a key's secret and default URL, the outbox rows
a status change leaves (PostgreSQL and SQLite), a job's deliveries, and the dispatcher sending
them through a receiver that is down for its first two attempts."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import time
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from app.webhooks import signing, urls
from tests.app.webhook_receiver import Receiver

SPEC = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64}
PUBLIC = "http://93.184.216.34/hooks"  # an address of the public internet (never reached: no dispatcher)


@pytest.fixture
def hook_api(services_env, monkeypatch):
    """The app without its dispatcher: a test sends (or not) the deliveries itself, and sees
    only its own (earlier tests' are deleted)."""
    from sqlalchemy import delete

    from app.db import session_scope
    from app.main import create_app
    from app.models import WebhookDelivery
    from tests.conftest import reset_caches

    monkeypatch.setenv("TRAINHUB_WEBHOOK_DISPATCH", "0")
    reset_caches()
    with session_scope() as session:
        session.execute(delete(WebhookDelivery))
        session.commit()
    with TestClient(create_app()) as client:
        yield client


@pytest.fixture
def allow_private(services_env, monkeypatch):
    """Webhooks to loopback allowed (listed before hook_api, whose settings it changes)."""
    monkeypatch.setenv("TRAINHUB_WEBHOOK_ALLOW_PRIVATE", "1")


def secret_for(api, auth) -> str:
    made = api.post("/webhooks/secret", headers=auth)
    assert made.status_code == 201, made.text
    return made.json()["secret"]


def deliveries(api, auth, job_id: str) -> list[dict]:
    page = api.get(f"/jobs/{job_id}/deliveries", headers=auth)
    assert page.status_code == 200, page.text
    return page.json()["items"]


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hook",
        "http://localhost/hook",
        "http://10.1.2.3/hook",
        "http://172.16.0.1/hook",
        "http://192.168.1.1/hook",
        "http://169.254.169.254/latest/meta-data",  # a cloud's metadata endpoint
        "http://100.64.0.1/hook",  # carrier-grade NAT
        "http://0.0.0.0/hook",
        "http://224.0.0.1/hook",
        "http://[::1]/hook",
        "http://[fe80::1]/hook",
        "http://[fd00::1]/hook",
        "http://[::ffff:127.0.0.1]/hook",  # an IPv4 address in IPv6 clothing
    ],
)
def test_urls_into_the_services_own_network_are_refused_unless_allowed(url):
    with pytest.raises(urls.RefusedUrl, match="TRAINHUB_WEBHOOK_ALLOW_PRIVATE"):
        urls.check(url, allow_private=False)
    assert urls.check(url, allow_private=True).url.host


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("ftp://93.184.216.34/x", "https://"),
        ("file:///etc/passwd", "https://"),
        ("http://user:pw@93.184.216.34/", "credentials"),
        ("http:///path", "no host"),
        ("http://93.184.216.34/a b", "spaces"),
        ("http://93.184.216.34/" + "a" * 2100, "longer than 2048"),
        ("https://no-such-host.invalid/hook", "does not resolve"),
    ],
)
def test_malformed_urls_are_refused_even_where_private_ones_are_allowed(url, why):
    with pytest.raises(urls.RefusedUrl, match=why):
        urls.check(url, allow_private=True)


def test_a_delivery_connects_to_the_address_that_was_checked_with_the_name_as_host():
    target = urls.check("https://localhost:8443/hooks?x=1", allow_private=True)
    url, host, extensions = target.pinned()
    assert ipaddress.ip_address(url.host).is_loopback and url.port == 8443 and url.path == "/hooks"
    assert url.query == b"x=1"
    assert host == {"Host": "localhost:8443"} and extensions == {"sni_hostname": "localhost"}


def test_a_signature_verifies_over_the_timestamp_and_the_exact_body():
    secret, body = signing.new_secret(), b'{"id":"d1","event":"job.running"}'
    value = signing.header(secret, body)
    timestamp = signing.verify(secret, value, body)
    assert value == f"t={timestamp},v1={signing.signature(secret, timestamp, body)}"
    for wrong_secret, wrong_body in ((signing.new_secret(), body), (secret, body + b" ")):
        with pytest.raises(signing.BadSignature, match="does not match"):
            signing.verify(wrong_secret, value, wrong_body)
    with pytest.raises(signing.BadSignature, match="300 s away"):
        signing.verify(secret, value, body, now=time.time() + 301)  # a delivery replayed later
    with pytest.raises(signing.BadSignature):
        signing.verify(secret, None, body)


def test_a_private_url_is_refused_with_422_by_default(hook_api, auth):
    secret_for(hook_api, auth)
    for path, body in (("/jobs", SPEC), ("/comparisons", {k: v for k, v in SPEC.items() if k != "framework"})):
        refused = hook_api.post(path, json={**body, "webhook_url": "http://10.0.0.7/hook"}, headers=auth)
        assert refused.status_code == 422, refused.text
        [error] = refused.json()["detail"]
        assert error["loc"] == ["body", "webhook_url"] and "TRAINHUB_WEBHOOK_ALLOW_PRIVATE" in error["msg"]
    assert hook_api.get("/jobs", headers=auth).json()["items"] == []  # nothing stored


def test_a_webhook_needs_the_keys_secret_which_is_shown_once(hook_api, auth):
    refused = hook_api.post("/jobs", json={**SPEC, "webhook_url": PUBLIC}, headers=auth)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "webhook_url"]
    assert "POST /webhooks/secret" in refused.json()["detail"][0]["msg"]
    assert hook_api.get("/webhooks", headers=auth).json() == {"url": None, "secret": None}

    secret = secret_for(hook_api, auth)
    shown = hook_api.get("/webhooks", headers=auth).json()
    assert secret.startswith("whsec_") and secret.startswith(shown["secret"]["prefix"])
    assert secret not in hook_api.get("/webhooks", headers=auth).text
    rotated = secret_for(hook_api, auth)
    assert rotated != secret and hook_api.get("/webhooks", headers=auth).json()["secret"]["prefix"] == rotated[:12]

    created = hook_api.post("/jobs", json={**SPEC, "webhook_url": PUBLIC}, headers=auth)
    assert created.status_code == 201, created.text
    assert created.json()["spec"]["webhook_url"] == PUBLIC


def test_every_status_change_of_a_job_with_a_webhook_is_recorded_once(hook_api, auth, make_key, rows):
    secret_for(hook_api, auth)
    job = hook_api.post("/jobs", json={**SPEC, "webhook_url": PUBLIC}, headers=auth).json()
    plain = hook_api.post("/jobs", json=SPEC, headers=auth).json()
    rows.start(job["id"])
    rows.epoch(job["id"], 1)
    rows.finish(job["id"])
    listed = deliveries(hook_api, auth, job["id"])
    assert [d["event"] for d in listed] == ["job.succeeded", "job.running", "job.queued"]  # newest first
    assert {d["status"] for d in listed} == {"pending"} and {d["url"] for d in listed} == {PUBLIC}
    assert all(d["attempts"] == 0 and d["delivered_at"] is None and d["next_attempt_at"] for d in listed)
    assert deliveries(hook_api, auth, plain["id"]) == []  # no webhook: nothing to send

    first = hook_api.get(f"/jobs/{job['id']}/deliveries?limit=2", headers=auth).json()
    second = hook_api.get(f"/jobs/{job['id']}/deliveries?limit=2&cursor={first['next_cursor']}", headers=auth).json()
    assert [d["id"] for d in first["items"] + second["items"]] == [d["id"] for d in listed]
    assert second["next_cursor"] is None
    bad = hook_api.get(f"/jobs/{job['id']}/deliveries?cursor=x", headers=auth)
    assert bad.status_code == 422 and bad.json()["detail"][0]["loc"] == ["query", "cursor"]

    other = {"Authorization": f"Bearer {make_key('other')}"}
    assert hook_api.get(f"/jobs/{job['id']}/deliveries", headers=other).status_code == 404
    assert hook_api.get("/jobs/00000000-0000-0000-0000-000000000000/deliveries", headers=auth).status_code == 404


def test_a_keys_default_url_serves_its_jobs_that_name_none(hook_api, auth, rows):
    refused = hook_api.post("/webhooks/url", json={"url": PUBLIC}, headers=auth)
    assert refused.status_code == 422 and "POST /webhooks/secret" in refused.json()["detail"][0]["msg"]
    secret_for(hook_api, auth)
    private = hook_api.post("/webhooks/url", json={"url": "http://192.168.0.2/"}, headers=auth)
    assert private.status_code == 422 and private.json()["detail"][0]["loc"] == ["body", "url"]
    assert hook_api.post("/webhooks/url", json={"url": PUBLIC}, headers=auth).json()["url"] == PUBLIC

    job = hook_api.post("/jobs", json=SPEC, headers=auth).json()
    own = hook_api.post("/jobs", json={**SPEC, "webhook_url": PUBLIC + "/own"}, headers=auth).json()
    assert [d["url"] for d in deliveries(hook_api, auth, job["id"])] == [PUBLIC]
    assert [d["url"] for d in deliveries(hook_api, auth, own["id"])] == [PUBLIC + "/own"]

    assert hook_api.delete("/webhooks/url", headers=auth).json()["url"] is None
    rows.start(job["id"])
    rows.start(own["id"])
    assert len(deliveries(hook_api, auth, job["id"])) == 1  # cleared: its next change goes nowhere
    assert len(deliveries(hook_api, auth, own["id"])) == 2


def test_a_comparisons_webhook_gets_both_jobs_and_names_the_comparison(hook_api, auth):
    from app.db import session_scope
    from app.models import WebhookDelivery
    from app.webhooks import outbox

    secret_for(hook_api, auth)
    body = {k: v for k, v in SPEC.items() if k != "framework"}
    comparison = hook_api.post("/comparisons", json={**body, "webhook_url": PUBLIC}, headers=auth).json()
    for side in comparison["jobs"].values():
        [queued] = deliveries(hook_api, auth, side["id"])
        with session_scope() as session:
            event = outbox.render(session, session.get(WebhookDelivery, queued["id"]))
        assert f'"comparison_id":"{comparison["id"]}"' in event


def test_a_sweeps_trials_take_no_webhook_of_their_own(hook_api, auth):
    secret_for(hook_api, auth)
    body = {"base": {**SPEC, "webhook_url": PUBLIC}, "space": {"batch_size": {"choice": [32, 64]}}, "max_trials": 2}
    refused = hook_api.post("/sweeps", json=body, headers=auth)
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "base", "webhook_url"]


def test_a_delivery_that_never_succeeds_is_failed_after_its_retry_window(hook_api, auth):
    from sqlalchemy import update

    from app.config import get_settings
    from app.db import session_scope
    from app.models import WebhookDelivery
    from app.webhooks import outbox

    secret_for(hook_api, auth)
    job = hook_api.post("/jobs", json={**SPEC, "webhook_url": PUBLIC}, headers=auth).json()
    settings = get_settings().model_copy(update={"webhook_retry_base_s": 60.0, "webhook_retry_for_s": 400.0})

    def waited(seconds: float) -> None:
        """As if `seconds` had passed: the row's times moved back as much."""
        row = WebhookDelivery
        back = timedelta(seconds=seconds)
        session.execute(update(row).values(created_at=row.created_at - back, next_attempt_at=row.next_attempt_at - back))
        session.commit()

    with session_scope() as session:
        [first] = outbox.claim(session, 10, settings)
        assert outbox.claim(session, 10, settings) == []  # leased: nobody else takes it
        assert outbox.record(session, first, 503, "answered 503", settings) == "pending"  # again in 60 s
        [pending] = deliveries(hook_api, auth, job["id"])
        assert pending["next_attempt_at"] > pending["last_attempt_at"] and pending["response_status"] == 503
        assert outbox.claim(session, 10, settings) == []  # not due yet
        waited(61)
        [second] = outbox.claim(session, 10, settings)
        assert second.attempt == 2 and second.body == first.body  # the same bytes
        assert outbox.record(session, second, 503, "answered 503", settings) == "pending"  # at 181 s, within 400 s
        waited(121)
        [third] = outbox.claim(session, 10, settings)
        assert outbox.record(session, first, 204, None, settings) is None  # a stale attempt writes nothing
        assert outbox.record(session, third, None, "ConnectError: refused", settings) == "failed"  # 182 + 240 s: past 400 s
        assert outbox.claim(session, 10, settings) == []
    [failed] = deliveries(hook_api, auth, job["id"])
    assert failed["status"] == "failed" and failed["next_attempt_at"] is None and failed["attempts"] == 3
    assert failed["error"] == "ConnectError: refused" and failed["response_status"] is None


async def _dispatch_until(done, settings, timeout_s: float = 60.0) -> None:
    from app.webhooks import dispatcher

    task = asyncio.create_task(dispatcher.run(settings))
    try:
        deadline = time.monotonic() + timeout_s
        while not done():
            assert time.monotonic() < deadline, "the deliveries did not arrive"
            assert not task.done(), task
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # time for a duplicate, were one to be sent
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def test_each_change_arrives_once_signed_after_the_receiver_was_down_twice(allow_private, hook_api, auth, rows):
    from app.config import get_settings

    secret = secret_for(hook_api, auth)
    settings = get_settings().model_copy(update={"webhook_retry_base_s": 0.1, "webhook_poll_s": 0.05})
    assert settings.webhook_allow_private
    with Receiver(down=2) as receiver:
        job = hook_api.post("/jobs", json={**SPEC, "webhook_url": receiver.url}, headers=auth).json()
        rows.start(job["id"])
        rows.epoch(job["id"], 1)
        rows.finish(job["id"], result={"test_accuracy": 0.9, "test_loss": 0.3})
        asyncio.run(_dispatch_until(lambda: len(receiver.delivered()) >= 3, settings))

    assert [r.answered for r in receiver.received[:2]] == [None, 503]
    got = receiver.delivered()
    assert [r.event["event"] for r in got] == ["job.queued", "job.running", "job.succeeded"]
    assert [r.event["job"]["status"] for r in got] == ["queued", "running", "succeeded"]  # the job at that change
    assert [len(r.event["job"]["metrics"]) for r in got] == [0, 0, 1]
    assert len({r.headers["Trainhub-Delivery"] for r in got}) == 3
    for r in got:
        signing.verify(secret, r.headers["Trainhub-Signature"], r.body)
        assert r.headers["Trainhub-Event"] == r.event["event"] and r.headers["Trainhub-Delivery"] == r.event["id"]
    assert receiver.received[0].body == got[0].body  # a retry sends the same bytes
    listed = deliveries(hook_api, auth, job["id"])
    assert [(d["event"], d["status"], d["attempts"]) for d in listed] == [
        ("job.succeeded", "delivered", 1),
        ("job.running", "delivered", 1),
        ("job.queued", "delivered", 3),
    ]
    assert listed[2]["response_status"] == 204 and listed[2]["error"] is None


def test_the_embedded_database_records_the_same_changes(tmp_path):
    """SQLite (trainhub up): the migration's trigger in SQLite's dialect; deleting a job deletes its rows."""
    from sqlalchemy import create_engine, delete, select, text, update
    from sqlalchemy.orm import Session

    from app.config import Settings
    from app.db import migrate
    from app.models import ApiKey, Job, WebhookDelivery, new_id
    from app.webhooks import outbox

    url = f"sqlite:///{tmp_path / 'trainhub.db'}"
    migrate(url)
    engine = create_engine(url)
    with Session(engine) as session:
        session.execute(text("PRAGMA foreign_keys=ON"))
        key = ApiKey(id=new_id(), name="k", prefix="th_x", key_hash="h" * 64, webhook_url="https://example.com/d")
        plain = ApiKey(id=new_id(), name="p", prefix="th_y", key_hash="i" * 64)
        session.add_all([key, plain])
        session.flush()
        own = Job(owner_id=plain.id, framework="jax", hardware="cpu", devices=1, epochs=2,
                  spec={"framework": "jax", "webhook_url": "https://example.com/own"})
        default = Job(owner_id=key.id, framework="jax", hardware="cpu", devices=1, epochs=2, spec={"framework": "jax"})
        none = Job(owner_id=plain.id, framework="jax", hardware="cpu", devices=1, epochs=2, spec={"framework": "jax"})
        session.add_all([own, default, none])
        session.commit()
        for job in (own, default, none):
            session.execute(update(Job).where(Job.id == job.id).values(status="running"))
            session.execute(update(Job).where(Job.id == job.id).values(epoch=1))  # not a status change
        session.commit()
        found = session.execute(select(WebhookDelivery.job_id, WebhookDelivery.seq, WebhookDelivery.event,
                                       WebhookDelivery.url, WebhookDelivery.job)).all()
        assert sorted((j, s, e, u) for j, s, e, u, _ in found) == sorted([
            (own.id, 1, "job.queued", "https://example.com/own"), (own.id, 2, "job.running", "https://example.com/own"),
            (default.id, 1, "job.queued", "https://example.com/d"),
            (default.id, 2, "job.running", "https://example.com/d"),
        ])
        assert {snapshot["status"] for *_, snapshot in found} == {"queued", "running"}
        assert all(len(d.id) == 36 and d.created_at is not None for d in session.scalars(select(WebhookDelivery)))
        # The dispatcher's claim there: each job's first change only (the second waits its turn).
        claimed = outbox.claim(session, 10, Settings(database_url=url))
        assert sorted(json.loads(c.body)["job"]["id"] for c in claimed) == sorted([own.id, default.id])
        assert {(c.event, json.loads(c.body)["job"]["status"]) for c in claimed} == {("job.queued", "queued")}
        assert outbox.claim(session, 10, Settings(database_url=url)) == []  # leased
        session.execute(delete(Job).where(Job.id == own.id))
        session.commit()
        assert {j for j, *_ in session.execute(select(WebhookDelivery.job_id))} == {default.id}
    engine.dispose()


def test_a_job_that_cannot_be_rendered_fails_its_delivery_without_blocking_the_others(hook_api, auth):
    from sqlalchemy import update

    from app.config import get_settings
    from app.db import session_scope
    from app.models import WebhookDelivery
    from app.webhooks import outbox

    secret_for(hook_api, auth)
    broken, fine = (hook_api.post("/jobs", json={**SPEC, "webhook_url": PUBLIC}, headers=auth).json() for _ in "ab")
    with session_scope() as session:
        row = session.scalars(update(WebhookDelivery).where(WebhookDelivery.job_id == broken["id"])
                              .values(job={"id": broken["id"], "spec": {"framework": "nope"}})
                              .returning(WebhookDelivery)).one()
        session.commit()
        claimed = outbox.claim(session, 10, get_settings())
    assert [c.id for c in claimed] == [d["id"] for d in deliveries(hook_api, auth, fine["id"])]
    [failed] = deliveries(hook_api, auth, broken["id"])
    assert failed["id"] == row.id and failed["status"] == "failed" and "could not be rendered" in failed["error"]
