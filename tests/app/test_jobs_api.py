"""The jobs API against real PostgreSQL and Redis (no worker: jobs stay queued)."""

from __future__ import annotations

import uuid

import pytest

DIGITS = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1}


def test_create_read_and_list(api, auth):
    created = api.post("/jobs", json=DIGITS, headers=auth)
    assert created.status_code == 201, created.text
    job = created.json()
    assert created.headers["Location"] == f"/jobs/{job['id']}"
    assert job["status"] == "queued"
    # the spec comes back normalised, with every default filled in
    assert job["spec"]["model"] == {"name": "mlp", "hidden_sizes": [256, 128], "dropout": 0.0}
    assert job["spec"]["optimizer"] == {"name": "adam", "learning_rate": 0.001}
    assert job["progress"] == {"epoch": 0, "epochs": 1}
    assert job["waiting_reason"] == "no online worker serves cpu.jax"
    assert api.get(f"/jobs/{job['id']}", headers=auth).json()["id"] == job["id"]
    assert [j["id"] for j in api.get("/jobs", headers=auth).json()["items"]] == [job["id"]]


def test_pages_are_newest_first_and_complete(api, auth):
    ids = [api.post("/jobs", json={**DIGITS, "seed": i}, headers=auth).json()["id"] for i in range(5)]
    seen, cursor = [], None
    while True:
        params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
        page = api.get("/jobs", params=params, headers=auth).json()
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))


def test_filters(api, auth):
    api.post("/jobs", json=DIGITS, headers=auth)
    api.post("/jobs", json={**DIGITS, "framework": "pytorch"}, headers=auth)
    items = api.get("/jobs", params={"framework": "pytorch"}, headers=auth).json()["items"]
    assert [j["spec"]["framework"] for j in items] == ["pytorch"]
    assert api.get("/jobs", params={"status": "running"}, headers=auth).json()["items"] == []
    assert api.get("/jobs", params={"status": "bogus"}, headers=auth).status_code == 422
    assert api.get("/jobs", params={"cursor": "not-a-cursor"}, headers=auth).status_code == 422


def test_cancel_queued_job(api, auth):
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    cancelled = api.post(f"/jobs/{job['id']}/cancel", headers=auth)
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["finished_at"] is not None
    # cancelling again is harmless
    assert api.post(f"/jobs/{job['id']}/cancel", headers=auth).json()["status"] == "cancelled"


def test_jobs_are_visible_only_to_their_owner(api, auth, make_key):
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    other = {"Authorization": f"Bearer {make_key('other')}"}
    assert api.get(f"/jobs/{job['id']}", headers=other).status_code == 404
    assert api.post(f"/jobs/{job['id']}/cancel", headers=other).status_code == 404
    assert api.get(f"/jobs/{job['id']}/metrics", headers=other).status_code == 404
    assert api.get(f"/jobs/{job['id']}/artifacts", headers=other).status_code == 404
    assert api.get("/jobs", headers=other).json()["items"] == []
    assert api.get(f"/jobs/{job['id']}", headers=auth).json()["status"] == "queued"


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer th_wrong"}, {"Authorization": "Basic abc"},
                                     {"Authorization": "Bearer "}])
def test_missing_or_wrong_key_is_401(api, headers):
    response = api.get("/jobs", headers=headers)
    assert response.status_code == 401
    assert "API key" in response.json()["detail"]
    assert api.post("/jobs", json=DIGITS, headers=headers).status_code == 401


def test_unknown_ids_are_404(api, auth):
    assert api.get("/jobs/nope", headers=auth).status_code == 404
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    response = api.get(f"/jobs/{job['id']}/artifacts/weights.safetensors", headers=auth)
    assert response.status_code == 404
    assert "weights.safetensors" in response.json()["detail"]
    assert api.get(f"/jobs/{job['id']}/metrics", headers=auth).json() == []


def test_idempotency_key(api, auth):
    headers = {**auth, "Idempotency-Key": "abc-1"}
    first = api.post("/jobs", json=DIGITS, headers=headers).json()
    again = api.post("/jobs", json=DIGITS, headers=headers)
    assert again.status_code == 201 and again.json()["id"] == first["id"]
    conflict = api.post("/jobs", json={**DIGITS, "epochs": 2}, headers=headers)
    assert conflict.status_code == 409
    assert "Idempotency-Key" in conflict.json()["detail"]
    assert len(api.get("/jobs", headers=auth).json()["items"]) == 1


def test_health_and_readiness(api):
    assert api.get("/healthz").json() == {"status": "ok"}
    ready = api.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"database": "ok", "broker": "ok"}


def test_job_is_stored_then_enqueued_on_its_queue(api, auth, redis_url):
    import redis

    job = api.post("/jobs", json={**DIGITS, "framework": "pytorch"}, headers=auth).json()
    r = redis.Redis.from_url(redis_url)
    assert r.llen("cpu.pytorch") == 1
    assert job["id"].encode() in r.lindex("cpu.pytorch", 0)


def test_concurrent_retries_with_one_idempotency_key_make_one_job(api, auth):
    from concurrent.futures import ThreadPoolExecutor

    headers = {**auth, "Idempotency-Key": "retry-storm"}
    with ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: api.post("/jobs", json=DIGITS, headers=headers), range(16)))
    assert {r.status_code for r in responses} == {201}
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(api.get("/jobs", headers=auth).json()["items"]) == 1


def test_odd_ids_and_bodies_are_4xx_not_500(api, auth):
    assert api.get("/jobs/a%00b", headers=auth).status_code == 404
    assert api.get("/comparisons/a%00b", headers=auth).status_code == 404
    body = '{"framework": "jax", "name": "\\ud800"}'
    response = api.post("/jobs", content=body, headers={**auth, "Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    assert "name" in str(response.json()["detail"])


def test_a_job_is_found_by_the_short_id_the_cli_shows_when_only_one_matches(api, auth, make_key):
    from sqlalchemy import update

    from app.db import session_scope
    from app.models import Job

    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    short = job["id"][:8]
    assert api.get(f"/jobs/{short}", headers=auth).json()["id"] == job["id"]
    assert api.get(f"/jobs/{short}/metrics", headers=auth).status_code == 200
    other = {"Authorization": f"Bearer {make_key('other')}"}
    assert api.get(f"/jobs/{short}", headers=other).status_code == 404  # another key's job: not found
    for bad in (job["id"][:7], "%" * 8, "________", short + "%"):
        assert api.get(f"/jobs/{bad}", headers=auth).status_code == 404, bad
    # Ids copied from elsewhere: upper case, without hyphens, in braces.
    for spelling in (short.upper(), job["id"].upper(), job["id"].replace("-", ""), "{" + job["id"] + "}"):
        assert api.get(f"/jobs/{spelling}", headers=auth).json()["id"] == job["id"], spelling

    # Two jobs starting with the same 8 characters: the short id names neither.
    twins = [api.post("/jobs", json={**DIGITS, "seed": s}, headers=auth).json()["id"] for s in (1, 2)]
    prefix = uuid.uuid4().hex[:8]  # the database outlives a test run: a new pair each time
    new_ids = [f"{prefix}-0000-4000-8000-00000000000{i}" for i in (1, 2)]
    with session_scope() as session:
        for twin, new_id in zip(twins, new_ids):
            session.execute(update(Job).where(Job.id == twin).values(id=new_id))
        session.commit()
    assert api.get(f"/jobs/{prefix}", headers=auth).status_code == 404
    assert api.get(f"/jobs/{new_ids[0][:-1]}", headers=auth).status_code == 404
    assert api.get(f"/jobs/{new_ids[1]}", headers=auth).json()["id"] == new_ids[1]


def test_every_time_is_utc_rfc_3339_with_a_z(api, auth, rows):
    """Issue 16, item 10: one spelling of a time in every answer and event."""
    import re

    stamp = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z")
    created = api.post("/jobs", json={"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1}, headers=auth)
    job_id = created.json()["id"]
    rows.start(job_id)
    rows.finish(job_id)
    answers = [created.json(), api.get(f"/jobs/{job_id}", headers=auth).json(),
               api.get("/jobs", headers=auth).json()["items"][0]]
    for job in answers:
        for field in ("created_at", "started_at", "finished_at"):
            assert job[field] is None or stamp.fullmatch(job[field]), (field, job[field])
    assert answers[1]["started_at"] and answers[1]["finished_at"]
    stream = api.get(f"/jobs/{job_id}/events", headers=auth).text
    ats = re.findall(r'"at": ?"([^"]+)"', stream)
    assert ats and all(stamp.fullmatch(at) for at in ats)


def test_artifact_urls_never_come_from_the_host_header(api, auth, rows, monkeypatch):
    """Issue 16, item 8: a client-chosen Host header must not become a link the API hands out."""
    from tests.conftest import reset_caches
    from workers.runner import store_artifacts

    job_id = api.post("/jobs", json={"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1},
                      headers=auth).json()["id"]
    from app.config import get_settings

    workdir = get_settings().resolved_artifact_dir() / job_id
    workdir.mkdir(parents=True)
    (workdir / "spec.json").write_text("{}")
    store_artifacts(job_id, workdir, ["spec.json"])
    rows.start(job_id)
    evil = {**auth, "Host": "evil.example"}
    for url in ([a["url"] for a in api.get(f"/jobs/{job_id}", headers=evil).json()["artifacts"]]
                + [a["url"] for a in api.get(f"/jobs/{job_id}/artifacts", headers=evil).json()]):
        assert url == f"/jobs/{job_id}/artifacts/spec.json"
    monkeypatch.setenv("TRAINHUB_PUBLIC_URL", "https://trainhub.example.com/")
    reset_caches()
    [artifact] = api.get(f"/jobs/{job_id}/artifacts", headers=evil).json()
    assert artifact["url"] == f"https://trainhub.example.com/jobs/{job_id}/artifacts/spec.json"


def test_a_user_key_sees_what_a_job_ran_on_not_where(api, auth, make_key, rows):
    """Issue 16, item 8: hostnames and process ids are for admin keys."""
    from app.rendering import worker_alias

    job_id = api.post("/jobs", json={"framework": "jax", "dataset": {"name": "digits"}}, headers=auth).json()["id"]
    worker = {"name": "gpu-host-7:4242:0a1b2c3d", "hostname": "gpu-host-7", "pid": 4242, "hardware": "cpu",
              "devices": ["cpu:0"], "versions": {"jax": "0.10.2"}}
    rows.start(job_id, worker)
    seen = api.get(f"/jobs/{job_id}", headers=auth).json()["worker"]
    assert seen == {"name": worker_alias(worker["name"]), "hardware": "cpu", "devices": ["cpu:0"],
                    "versions": {"jax": "0.10.2"}}
    assert "gpu-host-7" not in api.get("/jobs", headers=auth).text
    admin = {"Authorization": f"Bearer {make_key('ops', admin=True)}"}
    assert api.get(f"/jobs/{job_id}", headers=admin).json()["worker"] == worker


def test_a_stored_spec_that_no_longer_validates_is_served_as_stored(api, auth, rows):
    """A spec an earlier version accepted but this one refuses (its limits tightened, a field
    renamed) still renders: GET /jobs/{id} and the list answer 200 with the spec as stored."""
    from sqlalchemy import update

    from app.db import session_scope
    from app.models import Job

    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    stored = {**job["spec"], "batch_size": 0, "a_field_of_an_older_version": True}
    with session_scope() as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(spec=stored))
        session.commit()
    rows.start(job["id"])
    rows.finish(job["id"], "failed", error={"type": "invalid_spec", "reason": "spec_invalid", "message": "batch_size"})

    one = api.get(f"/jobs/{job['id']}", headers=auth)
    assert one.status_code == 200, one.text
    assert one.json()["spec"] == stored and one.json()["status"] == "failed"
    assert one.json()["model"] is None  # its parameter count cannot be worked out
    listed = api.get("/jobs", headers=auth)
    assert listed.status_code == 200, listed.text
    assert [j["spec"] for j in listed.json()["items"]] == [stored]
