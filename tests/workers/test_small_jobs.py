"""A worker's per-job path, made short for streams of small jobs (issue 23), keeps its behaviour:
a job run through workers/runner.py reports where its time went, a one-epoch job stores its
weights, a cancel is seen at the epoch's record, the second job of a spec reuses the first's
compiled programs, and a starting worker skips migrating a schema that is current. Real
PostgreSQL and Redis."""

from __future__ import annotations

import pytest
from sqlalchemy import text

DIGITS = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1}
WORKER = {"name": "test:small-jobs", "hostname": "test", "hardware": "cpu", "devices": ["cpu:0"], "versions": {}}


@pytest.fixture(autouse=True)
def no_waiting_jobs(services_env):
    """End what earlier tests left queued: the worker here must find only this test's jobs."""
    from app.db import session_scope

    with session_scope() as session:
        session.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status IN ('queued', 'running')"))
        session.commit()


def run(api, auth, spec: dict) -> dict:
    from workers import runner

    job = api.post("/jobs", json=spec, headers=auth).json()
    assert runner.run(job["id"], WORKER, serves=[f"cpu.{spec['framework']}"]) == "succeeded"
    return api.get(f"/jobs/{job['id']}", headers=auth).json()


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_a_one_epoch_job_stores_its_weights_and_says_where_its_time_went(api, auth, framework):
    job = run(api, auth, {**DIGITS, "framework": framework})

    names = {a["name"] for a in api.get(f"/jobs/{job['id']}/artifacts", headers=auth).json()}
    assert "weights.safetensors" in names
    assert [m["epoch"] for m in api.get(f"/jobs/{job['id']}/metrics", headers=auth).json()] == [1]
    for name in ("claim_s", "report_s", "artifacts_s", "setup_s", "train_s", "checkpoint_s"):
        assert job["timings"][name] >= 0, name
    assert job["timings"]["checkpoint_s"] == 0  # none after the last epoch: the weights are stored


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_an_ended_job_leaves_no_checkpoint_on_the_workers_disk(api, auth, framework):
    from app.config import get_settings

    job = run(api, auth, {**DIGITS, "framework": framework, "epochs": 3})
    folder = get_settings().resolved_artifact_dir() / job["id"]

    assert job["timings"]["checkpoint_s"] > 0  # it checkpointed while it ran (after epochs 1 and 2)
    assert (folder / "weights.safetensors").is_file()
    assert not (folder / "checkpoint.pt").exists() and not (folder / "checkpoints").exists()


def checkpointed(job_id: str, weights: bool = True):
    """The job's folder holding what a trainer leaves there while a job runs: PyTorch's checkpoint
    and the temporary file of a save cut short, JAX's Orbax folder, and (`weights`) the weights."""
    from app.config import get_settings

    folder = get_settings().resolved_artifact_dir() / job_id
    (folder / "checkpoints" / "2").mkdir(parents=True)
    (folder / "checkpoints" / "2" / "params").write_bytes(b"x" * 64)
    for name in ["checkpoint.pt", "checkpoint.partial", *(["weights.safetensors"] if weights else [])]:
        (folder / name).write_bytes(b"x" * 64)
    return folder


def checkpoint_left(folder) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("checkpoint"))


def test_a_job_cancelled_after_it_was_handed_back_to_the_queue_leaves_no_checkpoint(api, auth):
    from workers import runner

    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    attempt = runner.claim(job["id"], WORKER)[2]
    folder = checkpointed(job["id"])
    assert runner.release(job["id"], attempt) == "queued"
    assert checkpoint_left(folder) == ["checkpoint.partial", "checkpoint.pt", "checkpoints"]  # it resumes from them

    assert api.post(f"/jobs/{job['id']}/cancel", headers=auth).json()["status"] == "cancelled"
    assert checkpoint_left(folder) == []
    assert (folder / "weights.safetensors").is_file()  # what is not a checkpoint stays until retention


def test_a_cancelled_job_with_nothing_but_its_checkpoint_leaves_no_folder(api, auth):
    from workers import runner

    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    attempt = runner.claim(job["id"], WORKER)[2]
    folder = checkpointed(job["id"], weights=False)
    assert runner.release(job["id"], attempt) == "queued"

    assert api.post(f"/jobs/{job['id']}/cancel", headers=auth).json()["status"] == "cancelled"
    assert not folder.exists()


@pytest.mark.parametrize("cancelled", [False, True])
def test_a_job_its_lost_worker_ended_leaves_no_checkpoint(api, auth, monkeypatch, cancelled):
    from datetime import timedelta

    from sqlalchemy import update

    from app import config, lifecycle
    from app.db import session_scope
    from app.models import Job, utcnow
    from workers import reconciler, runner

    monkeypatch.setenv("TRAINHUB_RETRY_POLICY", "worker_lost=0")
    config.get_settings.cache_clear()
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    runner.claim(job["id"], {**WORKER, "name": "test:gone"})  # a worker that never beats again
    folder = checkpointed(job["id"])
    with session_scope() as session:
        session.execute(update(Job).where(Job.id == job["id"]).values(started_at=utcnow() - timedelta(hours=1)))
        session.commit()
        if cancelled:
            lifecycle.cancel(session, job["id"])  # running: flagged, its worker never sees it
    reconciler.requeue_lost_jobs()

    ended = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert ended["status"] == ("cancelled" if cancelled else "failed")
    assert checkpoint_left(folder) == []


def test_the_second_job_of_a_spec_reuses_the_compiled_programs_with_the_same_results(api, auth):
    from trainers import jax_trainer

    jax_trainer.forget_programs()
    spec = {**DIGITS, "epochs": 2}
    first, second = run(api, auth, spec), run(api, auth, spec)
    other = run(api, auth, {**spec, "batch_size": 64})

    assert first["timings"]["compilations"] == 1 and second["timings"]["compilations"] == 0
    assert type(first["timings"]["compilations"]) is int  # a count, in the JSON as one (not 1.0)
    assert other["timings"]["compilations"] == 1  # another shape: its own program
    assert first["result"] == second["result"]


def test_a_cancel_is_seen_when_the_epoch_is_recorded(api, auth, monkeypatch):
    from workers import runner

    job = api.post("/jobs", json={**DIGITS, "epochs": 3}, headers=auth).json()
    recorded = runner.JobHooks._record

    def record_then_cancel(self, epoch, metrics):
        if epoch == 1:  # the user cancels as epoch 1 is stored
            assert api.post(f"/jobs/{job['id']}/cancel", headers=auth).status_code == 202
        return recorded(self, epoch, metrics)

    monkeypatch.setattr(runner.JobHooks, "_record", record_then_cancel)
    monkeypatch.setattr(runner, "CANCEL_POLL_S", 3600.0)  # no look at the flags but the record's
    assert runner.run(job["id"], WORKER, serves=["cpu.jax"]) == "cancelled"
    assert len(api.get(f"/jobs/{job['id']}/metrics", headers=auth).json()) == 1  # no epoch after it


def test_a_replayed_epoch_is_stored_once(api, auth):
    from app.db import session_scope
    from trainers import EpochMetrics
    from workers import runner

    job = api.post("/jobs", json={**DIGITS, "epochs": 2}, headers=auth).json()
    _, _, attempt = runner.claim(job["id"], WORKER)
    hooks = runner.JobHooks(job["id"], attempt, None)
    metrics = EpochMetrics(epoch=1, train_loss=1.0, train_accuracy=0.5, test_loss=1.0, test_accuracy=0.5,
                           epoch_time_s=0.1, eval_time_s=0.01, samples_per_s=10.0)
    hooks.report(1, metrics)
    hooks.report(1, metrics)  # resumed from a checkpoint: the epoch is reported again

    with session_scope() as session:
        assert session.scalar(text("SELECT count(*) FROM epoch_metrics WHERE job_id = :id"), {"id": job["id"]}) == 1


def test_a_current_schema_is_not_migrated_again(services_env, tmp_path):
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from app.db import MIGRATIONS_DIR, head_revisions, make_engine, migrate, schema_current

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    assert head_revisions() == set(ScriptDirectory.from_config(config).get_heads())
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    engine = make_engine(url)
    assert not schema_current(engine)  # no tables yet: the worker migrates
    migrate(url)
    assert schema_current(engine)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0001'"))
    assert not schema_current(engine)  # behind: migrate() brings it up
    engine.dispose()
