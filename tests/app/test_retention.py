"""Retention (app/retention.py) on real PostgreSQL: exactly the expired finished jobs go, with
their metrics, artifacts and files (local and S3), their comparisons and sweeps only whole;
queued and running jobs never; a dry run deletes nothing and says the same; /metrics counts it;
the periodic run works in batches, one worker at a time; `trainhub gc`."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete, func, select, update
from typer.testing import CliRunner

from tests.app.test_security import add_artifact
from tests.conftest import reset_caches

SPEC = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64}
PAIR = {"dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64}


@pytest.fixture(autouse=True)
def empty_tables(services_env):
    """Each test starts with no job, comparison or sweep (the database is shared by the session)."""
    from app.db import session_scope
    from app.models import Comparison, Job, Sweep

    with session_scope() as session:
        for table in (Comparison, Job, Sweep):
            session.execute(delete(table))
        session.commit()


@pytest.fixture
def server_days(monkeypatch):
    """Set TRAINHUB_RETENTION_DAYS for this process: `server_days(30)`; None unsets it."""

    def set_days(days: int | None) -> None:
        if days is None:
            monkeypatch.delenv("TRAINHUB_RETENTION_DAYS", raising=False)
        else:
            monkeypatch.setenv("TRAINHUB_RETENTION_DAYS", str(days))
        from app import config

        config.get_settings.cache_clear()

    return set_days


def submit(api, auth, **changes) -> str:
    response = api.post("/jobs", json={**SPEC, **changes}, headers=auth)
    assert response.status_code == 201, response.text
    return response.json()["id"]


def backdate(job_id: str, days: float) -> None:
    """Move a job's times `days` into the past, as if it had ended then."""
    from app.db import session_scope
    from app.models import Job, utcnow

    moment = utcnow() - timedelta(days=days)
    with session_scope() as session:
        job = session.get(Job, job_id)
        values = {"created_at": moment - timedelta(minutes=5)}
        if job.started_at is not None:
            values["started_at"] = moment - timedelta(minutes=1)
        if job.finished_at is not None:
            values["finished_at"] = moment
        session.execute(update(Job).where(Job.id == job_id).values(**values))
        session.commit()


def finished(rows, job_id: str, days_ago: float, status: str = "succeeded", files: int = 1) -> list[Path]:
    """A job that ran two epochs, stored `files` artifacts and a checkpoint that is no artifact,
    and ended `days_ago` days ago; its files."""
    rows.start(job_id)
    rows.epoch(job_id, 1)
    rows.epoch(job_id, 2)
    rows.finish(job_id, status)
    backdate(job_id, days_ago)
    paths = [add_artifact(job_id, f"file{i}.bin", b"x" * (100 + i)) for i in range(files)]
    checkpoint = paths[0].parent / "checkpoints" / "epoch_2.ckpt"
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_bytes(b"c" * 50)
    return [*paths, checkpoint]


def artifact_dir() -> Path:
    from app.config import get_settings

    return get_settings().resolved_artifact_dir()


def run(dry_run: bool = False):
    from app import retention

    return retention.delete_expired(dry_run=dry_run)


def stored_jobs() -> set[str]:
    from app.db import session_scope
    from app.models import Job

    with session_scope() as session:
        return set(session.scalars(select(Job.id)))


def rows_of(job_ids: set[str]) -> tuple[int, int]:
    """(epoch_metrics rows, artifacts rows) of the jobs."""
    from app.db import session_scope
    from app.models import Artifact, EpochMetric

    with session_scope() as session:
        metrics = session.scalar(select(func.count()).where(EpochMetric.job_id.in_(job_ids)))
        artifacts = session.scalar(select(func.count()).where(Artifact.job_id.in_(job_ids)))
        return metrics, artifacts


# --- which jobs go ---------------------------------------------------------------------------


def test_exactly_the_expired_finished_jobs_go_with_their_metrics_artifacts_and_files(api, auth, rows, server_days):
    server_days(30)
    expired = {
        "succeeded": submit(api, auth),
        "failed": submit(api, auth),
        "cancelled": submit(api, auth),
        "own_7_days": submit(api, auth, retention_days=7),
    }
    files = {
        expired["succeeded"]: finished(rows, expired["succeeded"], 40, files=2),
        expired["failed"]: finished(rows, expired["failed"], 31, status="failed"),
        expired["cancelled"]: finished(rows, expired["cancelled"], 30.01, status="cancelled"),
        expired["own_7_days"]: finished(rows, expired["own_7_days"], 8),
    }
    fresh = submit(api, auth)
    fresh_files = finished(rows, fresh, 29)
    own_fresh = submit(api, auth, retention_days=7)
    finished(rows, own_fresh, 6)
    old_queued = submit(api, auth)
    backdate(old_queued, 400)
    old_running = submit(api, auth)
    rows.start(old_running)
    rows.epoch(old_running, 1)
    backdate(old_running, 400)
    everything = stored_jobs()

    report = run()

    assert sorted(report.jobs) == sorted(expired.values())
    assert stored_jobs() == everything - set(expired.values())
    assert {old_queued, old_running, fresh, own_fresh} <= stored_jobs()
    assert rows_of(set(expired.values())) == (0, 0)
    deleted_files = [path for paths in files.values() for path in paths]
    assert not any(path.exists() for path in deleted_files)
    assert not any((artifact_dir() / job_id).exists() for job_id in expired.values())  # nor their folders
    assert report.files == len(deleted_files) == 9
    assert report.bytes == 100 + 101 + 3 * 100 + 4 * 50
    assert (report.comparisons, report.sweeps, report.kept, report.done) == ([], [], 0, True)
    assert all(path.exists() for path in fresh_files)
    assert rows_of({fresh}) == (2, 1)
    assert api.get(f"/jobs/{expired['succeeded']}", headers=auth).status_code == 404
    assert api.get(f"/jobs/{fresh}", headers=auth).status_code == 200
    assert run().jobs == []  # nothing left to delete


def test_with_no_server_retention_only_jobs_with_their_own_expire(api, auth, rows, server_days):
    server_days(None)
    ancient = submit(api, auth)
    finished(rows, ancient, 3650)
    own = submit(api, auth, retention_days=1)
    finished(rows, own, 1.5)
    own_fresh = submit(api, auth, retention_days=2)
    finished(rows, own_fresh, 1.5)

    report = run()

    assert report.jobs == [own] and report.retention_days is None
    assert stored_jobs() == {ancient, own_fresh}


def test_a_job_with_a_retention_of_its_own_keeps_it_in_its_row(api, auth):
    from app.db import session_scope
    from app.models import Job

    job_id = submit(api, auth, retention_days=3)
    other = submit(api, auth)
    with session_scope() as session:
        assert session.get(Job, job_id).retention_days == 3
        assert session.get(Job, other).retention_days is None
    assert "retention_days" not in api.get(f"/jobs/{other}", headers=auth).json()["spec"]  # stored specs as before


def test_a_comparison_goes_only_with_both_its_jobs(api, auth, rows, server_days):
    server_days(30)
    half = api.post("/comparisons", json=PAIR, headers=auth).json()
    finished(rows, half["jobs"]["jax"]["id"], 40)
    finished(rows, half["jobs"]["pytorch"]["id"], 10)
    whole = api.post("/comparisons", json=PAIR, headers=auth).json()
    finished(rows, whole["jobs"]["jax"]["id"], 40)
    finished(rows, whole["jobs"]["pytorch"]["id"], 35)
    running = api.post("/comparisons", json=PAIR, headers=auth).json()
    finished(rows, running["jobs"]["jax"]["id"], 40)
    rows.start(running["jobs"]["pytorch"]["id"])

    report = run()

    assert report.comparisons == [whole["id"]]
    assert sorted(report.jobs) == sorted(job["id"] for job in whole["jobs"].values())
    assert report.kept == 2  # the expired jax jobs of the other two
    assert api.get(f"/comparisons/{whole['id']}", headers=auth).status_code == 404
    for kept in (half, running):
        body = api.get(f"/comparisons/{kept['id']}", headers=auth).json()
        assert {job["id"] for job in body["jobs"].values()} == {job["id"] for job in kept["jobs"].values()}


def make_sweep(api, auth, **changes) -> tuple[str, list[str]]:
    """A sweep of two trials, queued: its id and its trials' jobs."""
    body = {
        "base": SPEC,
        "space": {"optimizer.learning_rate": {"log_uniform": [1e-3, 1e-1]}},
        "max_trials": 2,
        "parallelism": 2,
        **changes,
    }
    created = api.post("/sweeps", json=body, headers=auth)
    assert created.status_code == 201, created.text
    sweep_id = created.json()["id"]
    return sweep_id, trial_jobs(sweep_id)


def trial_jobs(sweep_id: str) -> list[str]:
    from app.db import session_scope
    from app.models import Job

    with session_scope() as session:
        return sorted(session.scalars(select(Job.id).where(Job.sweep_id == sweep_id)))


def end_sweep(sweep_id: str) -> None:
    from app.db import session_scope
    from app.models import Sweep, utcnow
    from app.status import SweepStatus

    with session_scope() as session:
        session.execute(
            update(Sweep).where(Sweep.id == sweep_id).values(status=SweepStatus.SUCCEEDED, finished_at=utcnow())
        )
        session.commit()


def has_study(sweep_id: str) -> bool:
    import optuna

    from app.sweeps import study

    try:
        optuna.load_study(study_name=sweep_id, storage=study.get_storage())
    except KeyError:
        return False
    return True


def test_a_sweep_goes_with_all_its_trials_and_its_study_once_every_trial_expired(api, auth, rows, server_days):
    server_days(30)
    both, both_trials = make_sweep(api, auth, frameworks=["jax", "pytorch"], base=PAIR)
    assert len(both_trials) == 4  # two trials, each in both frameworks: two comparisons
    for job_id in both_trials:
        finished(rows, job_id, 45)
    end_sweep(both)
    one_fresh, (first, second) = make_sweep(api, auth)
    finished(rows, first, 45)
    finished(rows, second, 3)
    end_sweep(one_fresh)
    still_running, running_trials = make_sweep(api, auth)
    for job_id in running_trials:
        finished(rows, job_id, 45)
    assert has_study(both)

    report = run()

    assert report.sweeps == [both]
    assert sorted(report.jobs) == both_trials
    assert len(report.comparisons) == 2
    assert report.kept == 3  # the expired trials of the other two sweeps
    assert not has_study(both) and has_study(one_fresh)
    assert api.get(f"/sweeps/{both}", headers=auth).status_code == 404
    assert trial_jobs(one_fresh) == sorted([first, second]) and trial_jobs(still_running) == running_trials
    assert api.get(f"/sweeps/{one_fresh}", headers=auth).status_code == 200


# --- dry run, counters, the periodic run -------------------------------------------------------


def mixed_history(api, auth, rows) -> None:
    """Three expired jobs, one of them in a comparison with a fresh one, and a fresh job."""
    for days in (40, 50):
        finished(rows, submit(api, auth), days)
    pair = api.post("/comparisons", json=PAIR, headers=auth).json()
    finished(rows, pair["jobs"]["jax"]["id"], 40)
    finished(rows, pair["jobs"]["pytorch"]["id"], 5)
    whole = api.post("/comparisons", json=PAIR, headers=auth).json()
    finished(rows, whole["jobs"]["jax"]["id"], 40)
    finished(rows, whole["jobs"]["pytorch"]["id"], 41)
    finished(rows, submit(api, auth), 1)


def test_a_dry_run_deletes_nothing_and_reports_what_the_run_then_deletes(api, auth, rows, server_days):
    server_days(30)
    mixed_history(api, auth, rows)
    before = stored_jobs()

    dry = run(dry_run=True)

    assert stored_jobs() == before
    assert len(dry.jobs) == 4 and len(dry.comparisons) == 1 and dry.kept == 1 and dry.files == 8
    real = run()
    assert {**real.as_dict(), "dry_run": True} == dry.as_dict()
    assert stored_jobs() == before - set(dry.jobs)


def scrape(api, auth) -> dict[str, float]:
    text = api.get("/metrics", headers=auth).text
    return {name: float(value) for name, value in re.findall(r"^(trainhub_retention_\w+_total) (\S+)$", text, re.M)}


def test_metrics_count_what_retention_deleted(api, auth, make_key, rows, server_days):
    ops = {"Authorization": f"Bearer {make_key('ops', admin=True)}"}  # service-wide families: admin keys
    server_days(30)
    before = scrape(api, ops)
    assert set(before) == {
        f"trainhub_retention_deleted_{what}_total" for what in ("jobs", "comparisons", "sweeps", "files", "bytes")
    }
    mixed_history(api, auth, rows)
    run(dry_run=True)
    assert scrape(api, ops) == before  # a dry run counts nothing

    report = run()

    after = scrape(api, ops)
    grown = {
        name.removeprefix("trainhub_retention_deleted_").removesuffix("_total"): after[name] - before[name]
        for name in after
    }
    assert grown == {"jobs": 4, "comparisons": 1, "sweeps": 0, "files": report.files, "bytes": report.bytes}
    assert report.files == 8


def test_the_periodic_run_works_in_batches_one_worker_at_a_time_then_waits_its_interval(
    api, auth, rows, server_days, monkeypatch
):
    from app import counters, retention
    from app.db import session_scope
    from workers.reconciler import reconcile

    server_days(30)
    monkeypatch.setenv("TRAINHUB_RETENTION_INTERVAL_S", "3600")
    reset_caches()
    expired = {submit(api, auth) for _ in range(5)}
    for job_id in expired:
        finished(rows, job_id, 31)
    monkeypatch.setattr(retention, "BATCH_JOBS", 2)
    monkeypatch.setattr(retention, "TICK_BUDGET_S", 0.0)  # one batch per heartbeat
    retention._schedule(0)  # due now
    monkeypatch.setattr(retention, "_next_look", 0.0)

    reconcile()  # a heartbeat's tick: one batch
    assert len(stored_jobs()) == 3
    ticks = []
    while not ticks or not ticks[-1].done:
        ticks.append(retention.delete_expired_if_due())  # (each goes on at once: _next_look stays 0)
        assert len(ticks) < 10

    assert [len(tick.jobs) for tick in ticks] == [2, 1]
    assert stored_jobs() == set()
    with session_scope() as session:
        due = counters.read(session, [retention.DUE_AT])[retention.DUE_AT]
    assert 3590 < due - time.time() <= 3600
    monkeypatch.setattr(retention, "_next_look", 0.0)
    assert retention.delete_expired_if_due() is None  # not due again for an hour


def test_only_one_worker_gets_a_due_run():
    from app import retention

    now_s = int(time.time())
    retention._schedule(now_s)
    assert retention._claim(now_s, now_s + retention.LEASE_S) is True
    assert retention._claim(now_s, now_s + retention.LEASE_S) is False  # another worker, same moment
    assert retention._claim(now_s + retention.LEASE_S, now_s + 2 * retention.LEASE_S) is True  # the lease ran out


# --- the limit, S3, the command line ---------------------------------------------------------


def test_a_retention_longer_than_the_servers_is_refused_naming_the_setting(api, auth, server_days):
    from app import retention
    from trainers.spec import JobSpec

    server_days(30)
    response = api.post("/jobs", json={**SPEC, "retention_days": 31}, headers=auth)
    assert response.status_code == 422, response.text
    (error,) = [e for e in response.json()["detail"] if e["loc"] == ["body", "retention_days"]]
    assert "TRAINHUB_RETENTION_DAYS" in error["msg"] and "30" in error["msg"]
    assert api.post("/jobs", json={**SPEC, "retention_days": 30}, headers=auth).status_code == 201
    assert api.post("/jobs", json={**SPEC, "retention_days": 0}, headers=auth).status_code == 422
    assert retention.spec_errors(JobSpec.model_validate({**SPEC, "retention_days": 31}))[0]["ctx"] == {
        "limit": "retention_days",
        "value": 30,
    }
    server_days(None)
    assert retention.spec_errors(JobSpec.model_validate({**SPEC, "retention_days": 3650})) == []


def test_expired_jobs_objects_are_deleted_from_s3(api, auth, rows, server_days, s3_env, monkeypatch):
    import boto3

    from app.config import get_settings
    from workers.runner import store_artifacts

    for name, value in s3_env.items():
        monkeypatch.setenv(name, value)
    reset_caches()
    server_days(30)
    old, fresh = submit(api, auth), submit(api, auth)
    for job_id in (old, fresh):
        workdir = get_settings().resolved_artifact_dir() / job_id
        workdir.mkdir(parents=True)
        (workdir / "weights.safetensors").write_bytes(b"w" * 1000)
        (workdir / "spec.json").write_text("{}")
        store_artifacts(job_id, workdir, ["spec.json", "weights.safetensors"])
        (workdir / "weights.safetensors").unlink()  # the worker's scratch copy is gone: only S3 has it
        (workdir / "spec.json").unlink()
        workdir.rmdir()
        finished_s3(rows, job_id, 40 if job_id == old else 2)
    bucket = boto3.client(
        "s3",
        endpoint_url=s3_env["TRAINHUB_S3_ENDPOINT_URL"],
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )

    def keys() -> set[str]:
        listed = bucket.list_objects_v2(Bucket=s3_env["TRAINHUB_S3_BUCKET"])
        return {item["Key"] for item in listed.get("Contents", [])}

    assert len(keys()) == 4
    report = run()

    assert report.jobs == [old] and (report.files, report.bytes) == (2, 1002)
    assert keys() == {f"artifacts/{fresh}/spec.json", f"artifacts/{fresh}/weights.safetensors"}


def finished_s3(rows, job_id: str, days_ago: float) -> None:
    rows.start(job_id)
    rows.epoch(job_id, 1)
    rows.finish(job_id)
    backdate(job_id, days_ago)


def test_trainhub_gc_dry_run_says_what_would_go_and_deletes_nothing(api, auth, rows, server_days):
    from app.cli import cli

    server_days(30)
    mixed_history(api, auth, rows)
    before = stored_jobs()

    result = CliRunner().invoke(cli, ["gc", "--dry-run"], catch_exceptions=False)

    assert result.exit_code == 0, result.output
    assert "retention: 30 days after a job ends (TRAINHUB_RETENTION_DAYS)" in result.output
    assert "would delete 4 jobs, 1 comparison, 0 sweeps; 8 files" in result.output
    assert "kept 1 expired job" in result.output
    expected = run(dry_run=True)
    assert ("jobs: " + " ".join(job_id[:8] for job_id in expected.jobs)) in result.output
    assert stored_jobs() == before

    as_json = CliRunner().invoke(cli, ["gc", "--dry-run", "--json"], catch_exceptions=False)
    assert json.loads(as_json.stdout) == expected.as_dict()
    assert stored_jobs() == before

    deleted = CliRunner().invoke(cli, ["gc"], catch_exceptions=False)
    assert "deleted 4 jobs, 1 comparison, 0 sweeps; 8 files" in deleted.output
    assert stored_jobs() == before - set(expected.jobs)
