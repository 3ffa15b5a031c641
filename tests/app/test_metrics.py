"""GET /metrics: Prometheus text that prometheus-client's parser reads, and that moves with jobs."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

DIGITS = {"framework": "pytorch", "dataset": {"name": "digits"}, "epochs": 2}


def scrape(api, auth) -> dict[str, dict]:
    """{family name: {(sample name, sorted labels): value}}."""
    response = api.get("/metrics", headers=auth)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    families = {}
    for family in text_string_to_metric_families(response.text):
        families[family.name] = {(s.name, tuple(sorted(s.labels.items()))): s.value for s in family.samples}
    return families


def value(families: dict, family: str, sample: str | None = None, **labels) -> float:
    return families[family].get((sample or family, tuple(sorted(labels.items()))), 0.0)


def test_metrics_parse_and_move_as_jobs_run(api, auth, rows):
    # The database is shared by the session's tests: every check is a difference.
    before = scrape(api, auth)
    for name in ("trainhub_jobs", "trainhub_queue_depth", "trainhub_workers_online",
                 "trainhub_job_duration_seconds", "trainhub_epoch_duration_seconds"):
        assert name in before, name
    for status in ("queued", "running", "succeeded", "failed", "cancelled"):
        assert ("trainhub_jobs", (("status", status),)) in before["trainhub_jobs"]
    for queue in ("cpu.jax", "cpu.pytorch", "gpu.jax", "gpu.pytorch", "tpu.jax", "tpu.pytorch"):
        assert ("trainhub_queue_depth", (("queue", queue),)) in before["trainhub_queue_depth"]
    assert ("trainhub_workers_online", (("hardware", "cpu"),)) in before["trainhub_workers_online"]

    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    queued = scrape(api, auth)
    assert value(queued, "trainhub_jobs", status="queued") - value(before, "trainhub_jobs", status="queued") == 1
    assert (value(queued, "trainhub_queue_depth", queue="cpu.pytorch")
            - value(before, "trainhub_queue_depth", queue="cpu.pytorch")) == 1

    rows.start(job["id"])
    rows.epoch(job["id"], 1, epoch_time_s=0.3)
    rows.epoch(job["id"], 2, epoch_time_s=7.0)
    rows.finish(job["id"], seconds=42.0)
    after = scrape(api, auth)
    assert value(after, "trainhub_jobs", status="succeeded") - value(before, "trainhub_jobs", status="succeeded") == 1
    assert value(after, "trainhub_jobs", status="queued") == value(before, "trainhub_jobs", status="queued")

    def moved(family: str, suffix: str, **labels) -> float:
        sample = f"{family}_{suffix}"
        return value(after, family, sample, **labels) - value(before, family, sample, **labels)

    job_labels = {"framework": "pytorch", "hardware": "cpu", "status": "succeeded"}
    assert moved("trainhub_job_duration_seconds", "count", **job_labels) == 1
    assert abs(moved("trainhub_job_duration_seconds", "sum", **job_labels) - 42.0) < 1e-3
    assert moved("trainhub_job_duration_seconds", "bucket", **job_labels, le="30.0") == 0
    assert moved("trainhub_job_duration_seconds", "bucket", **job_labels, le="60.0") == 1

    epoch_labels = {"framework": "pytorch", "hardware": "cpu"}
    assert moved("trainhub_epoch_duration_seconds", "count", **epoch_labels) == 2
    assert abs(moved("trainhub_epoch_duration_seconds", "sum", **epoch_labels) - 7.3) < 1e-6
    assert moved("trainhub_epoch_duration_seconds", "bucket", **epoch_labels, le="0.5") == 1
    assert moved("trainhub_epoch_duration_seconds", "bucket", **epoch_labels, le="+Inf") == 2


def test_metrics_need_a_key(api):
    assert api.get("/metrics").status_code == 401


def test_a_user_key_reads_its_own_numbers_and_admin_and_scrape_keys_the_services(api, auth, make_key, rows):
    from app.db import session_scope
    from app.keys import create_key

    other = {"Authorization": f"Bearer {make_key('other')}"}
    admin = {"Authorization": f"Bearer {make_key('ops', admin=True)}"}
    with session_scope() as session:
        scraper = {"Authorization": f"Bearer {create_key(session, 'prometheus', scrape_only=True)[1]}"}
    mine = scrape(api, auth)
    assert sum(v for v in mine["trainhub_jobs"].values()) == 0  # a new key: none of its own yet
    assert "trainhub_retention_deleted_jobs" not in mine and "trainhub_api_process_cpu_seconds" not in mine
    wide_before = scrape(api, admin)
    job = api.post("/jobs", json=DIGITS, headers=other).json()
    rows.start(job["id"])
    rows.finish(job["id"], seconds=3.0)
    assert scrape(api, auth)["trainhub_jobs"] == mine["trainhub_jobs"]  # another key's job is not counted
    theirs = scrape(api, other)
    assert value(theirs, "trainhub_jobs", status="succeeded") == 1
    for wide in (scrape(api, admin), scrape(api, scraper)):
        assert value(wide, "trainhub_jobs", status="succeeded") == value(wide_before, "trainhub_jobs",
                                                                         status="succeeded") + 1
        assert "trainhub_retention_deleted_jobs" in wide
    refused = api.get("/jobs", headers=scraper)
    assert refused.status_code == 403 and "scrape key" in refused.json()["detail"]


def test_scrape_keys_come_from_the_cli_and_say_what_they_are(api, services_env):
    import json

    from typer.testing import CliRunner

    from app.cli import cli

    created = CliRunner().invoke(cli, ["keys", "create", "--name", "prometheus", "--scrape"])
    assert created.exit_code == 0 and "created scrape key" in created.output
    secret = created.output.strip().splitlines()[-1]
    assert api.get("/metrics", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    assert api.get("/sweeps", headers={"Authorization": f"Bearer {secret}"}).status_code == 403
    listed = json.loads(CliRunner().invoke(cli, ["keys", "list", "--json"]).stdout)
    assert any(k["name"] == "prometheus" and k["scrape"] and not k["admin"] for k in listed)
