"""The comparisons API on real PostgreSQL and Redis (no worker: jobs stay queued)."""

from __future__ import annotations

from sqlalchemy import update

from app.db import session_scope
from app.models import Job

SPEC = {"dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64}


def test_a_comparison_is_two_jobs_with_the_same_spec(api, auth, redis_url):
    import redis

    created = api.post("/comparisons", json=SPEC, headers=auth)
    assert created.status_code == 201, created.text
    comparison = created.json()
    assert created.headers["Location"] == f"/comparisons/{comparison['id']}"
    assert comparison["status"] == "queued" and comparison["table"] is None
    jax_job, torch_job = comparison["jobs"]["jax"], comparison["jobs"]["pytorch"]
    assert (jax_job["spec"]["framework"], torch_job["spec"]["framework"]) == ("jax", "pytorch")
    assert {k: v for k, v in jax_job["spec"].items() if k != "framework"} == \
           {k: v for k, v in torch_job["spec"].items() if k != "framework"}
    r = redis.Redis.from_url(redis_url)
    assert r.llen("cpu.jax") == 1 and r.llen("cpu.pytorch") == 1
    assert api.get(f"/comparisons/{comparison['id']}", headers=auth).json()["id"] == comparison["id"]
    assert [c["id"] for c in api.get("/comparisons", headers=auth).json()["items"]] == [comparison["id"]]


def test_the_comparisons_list_comes_in_pages_newest_first(api, auth):
    made = [api.post("/comparisons", json={**SPEC, "seed": seed}, headers=auth).json()["id"] for seed in range(3)]

    first = api.get("/comparisons", params={"limit": 2}, headers=auth).json()
    second = api.get("/comparisons", params={"limit": 2, "cursor": first["next_cursor"]}, headers=auth).json()
    assert [c["id"] for c in first["items"] + second["items"]] == made[::-1]
    assert second["next_cursor"] is None
    refused = api.get("/comparisons", params={"cursor": "bm9wZQ=="}, headers=auth)
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["query", "cursor"]

    from fastapi.testclient import TestClient

    from app.client import TrainhubClient

    client = TrainhubClient("http://testserver", None)
    client.http = TestClient(api.app, headers=auth)  # the CLI's client, on this app
    assert [c["id"] for c in client.comparisons(limit=2)] == made[:0:-1]
    assert [c["id"] for c in client.comparisons(limit=200)] == made[::-1]


def test_a_spec_naming_a_framework_is_refused(api, auth):
    response = api.post("/comparisons", json={**SPEC, "framework": "jax"}, headers=auth)
    assert response.status_code == 422
    assert "remove 'framework'" in response.json()["detail"][0]["msg"]
    assert api.get("/jobs", headers=auth).json()["items"] == []


def test_cancelling_a_comparison_cancels_both_jobs(api, auth):
    comparison = api.post("/comparisons", json=SPEC, headers=auth).json()
    cancelled = api.post(f"/comparisons/{comparison['id']}/cancel", headers=auth)
    assert cancelled.status_code == 202
    body = cancelled.json()
    assert body["status"] == "cancelled"
    assert {job["status"] for job in body["jobs"].values()} == {"cancelled"}


def test_one_side_failing_fails_the_comparison_with_its_error(api, auth):
    comparison = api.post("/comparisons", json=SPEC, headers=auth).json()
    torch_id = comparison["jobs"]["pytorch"]["id"]
    with session_scope() as session:  # as the worker records a trainer's exception
        session.execute(update(Job).where(Job.id == torch_id).values(
            status="failed", error={"type": "out_of_memory", "reason": "device", "message": "CUDA out of memory"}))
        session.commit()
    body = api.get(f"/comparisons/{comparison['id']}", headers=auth).json()
    assert body["status"] == "failed"
    assert body["error"] == {"framework": "pytorch", "type": "out_of_memory", "reason": "device",
                             "message": "CUDA out of memory"}
    assert body["table"] is None


def test_comparisons_are_private(api, auth, make_key):
    comparison = api.post("/comparisons", json=SPEC, headers=auth).json()
    short = comparison["id"][:8]  # as the dashboard lists them
    for spelling in (short, short.upper(), comparison["id"].upper()):
        assert api.get(f"/comparisons/{spelling}", headers=auth).json()["id"] == comparison["id"], spelling
    other = {"Authorization": f"Bearer {make_key('other')}"}
    assert api.get(f"/comparisons/{comparison['id']}", headers=other).status_code == 404
    assert api.get(f"/comparisons/{short}", headers=other).status_code == 404
    assert api.post(f"/comparisons/{comparison['id']}/cancel", headers=other).status_code == 404
    assert api.get("/comparisons", headers=other).json() == {"items": [], "next_cursor": None}


def test_the_tables_samples_per_s_is_the_median_of_epochs_2_to_n():
    from app.rendering import _values
    from app.models import EpochMetric

    job = Job(timings={}, result={}, metrics=[EpochMetric(epoch=e, samples_per_s=rate)
                                            for e, rate in enumerate([50.0, 300.0, 100.0, 1100.0], start=1)])
    assert _values(job, 10)["samples_per_s"] == 300.0  # epochs 2..4: 300, 100, 1100
    job.metrics = job.metrics[:3] + [EpochMetric(epoch=4, samples_per_s=200.0), EpochMetric(epoch=5, samples_per_s=900.0)]
    assert _values(job, 10)["samples_per_s"] == 250.0  # an even count: between the middle two
    job.metrics = job.metrics[:1]
    assert _values(job, 10)["samples_per_s"] == 50.0  # one epoch: that one


def test_the_compare_title_names_the_model():
    from app.cli import model_summary

    assert model_summary({"name": "mlp", "hidden_sizes": [256, 128]}) == "MLP [256, 128]"
    assert model_summary({"name": "cnn", "channels": [32, 64], "hidden_sizes": [128], "batch_norm": True}) == \
        "CNN conv [32, 64], dense [128], batch norm"
    # presets, layer lists and user code (a comparison of two entrypoints) have no hidden_sizes
    assert model_summary({"name": "resnet8"}) == "resnet8"
    assert model_summary({"name": None, "layers": [{"dense": 8}, {"dense": 10}]}) == "2 layers"
    code = {"name": None, "code": "code_1", "entrypoints": {"jax": "m:f", "pytorch": "m:g"}}
    assert model_summary(code) == "your code code_1 (jax m:f, pytorch m:g)"


def test_overlap_is_how_long_both_jobs_ran_at_once():
    from datetime import datetime, timedelta, timezone

    from app.rendering import overlap_s
    from app.models import Comparison

    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    jax_job, torch_job = Job(started_at=None, finished_at=None), Job(started_at=t0, finished_at=t0 + timedelta(seconds=10))
    comparison = Comparison(jax_job=jax_job, pytorch_job=torch_job)
    assert overlap_s(comparison) is None  # one has not started
    jax_job.started_at, jax_job.finished_at = t0 + timedelta(seconds=4), t0 + timedelta(seconds=30)
    assert overlap_s(comparison) == 6.0  # 4 s .. 10 s
    jax_job.started_at = t0 + timedelta(seconds=12)
    assert overlap_s(comparison) == 0.0  # one after the other
    jax_job.started_at = (t0 - timedelta(seconds=1)).replace(tzinfo=None)  # as SQLite hands it back
    assert overlap_s(comparison) == 10.0
