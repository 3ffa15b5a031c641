"""Every failed job says why with an `error.type` from the closed list (app/failures.py), and the
deployment's retry policy (TRAINHUB_RETRY_POLICY) sends the types it names back to the queue.

Jobs run here through workers/runner.py (claim, train, record, end) on the real PostgreSQL and
Redis; out-of-memory, which no cheap job reaches, is a unit test of the classifier plus the retry
transition driven with a real out-of-memory failure."""

from __future__ import annotations

import pytest
from sqlalchemy import text, update

DIGITS = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1}
WORKER = {"name": "test:failures", "hostname": "test", "hardware": "cpu", "devices": ["cpu:0"], "versions": {}}


@pytest.fixture(autouse=True)
def no_waiting_jobs(services_env):
    """End what earlier tests left queued: the worker here must find only this test's jobs."""
    from app.db import session_scope

    with session_scope() as session:
        session.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status IN ('queued', 'running')"))
        session.commit()


def policy(monkeypatch, value: str | None) -> None:
    from app import config

    if value is None:
        monkeypatch.delenv("TRAINHUB_RETRY_POLICY", raising=False)
    else:
        monkeypatch.setenv("TRAINHUB_RETRY_POLICY", value)
    config.get_settings.cache_clear()


def run(api, auth, spec: dict, framework: str = "jax") -> dict:
    """Submit `spec`, let one worker take its turn, and return the job as the API shows it."""
    from workers import runner

    job = api.post("/jobs", json=spec, headers=auth).json()
    runner.run(job["id"], WORKER, serves=[f"cpu.{framework}"])
    return api.get(f"/jobs/{job['id']}", headers=auth).json()


def final_event(api, auth, job_id: str) -> dict:
    """The data of the last event of the job's (finished) event stream."""
    import json

    with api.stream("GET", f"/jobs/{job_id}/events", headers=auth) as stream:
        data = [json.loads(line[5:]) for line in stream.iter_lines() if line.startswith("data:")]
    return data[-1]


def without_fashion_mnist(monkeypatch, tmp_path) -> None:
    """This worker finds no Fashion-MNIST and cannot download it (offline)."""
    from trainers import data

    monkeypatch.delenv("TRAINHUB_DATA_DIR", raising=False)
    monkeypatch.setattr(data, "_OS_DIRS", {**data._OS_DIRS, "fashion-mnist": str(tmp_path / "none")})
    monkeypatch.setattr(data, "download_dir", lambda data_dir: tmp_path / "downloads")
    monkeypatch.setattr(data, "_download", lambda name, root: None)


FASHION = {"framework": "jax", "dataset": {"name": "fashion-mnist", "train_limit": 256, "test_limit": 128},
           "epochs": 1}


# --- each class a cheap job reaches -------------------------------------------------------------


def test_a_diverging_learning_rate_fails_as_nan_loss_in_the_job_and_its_events(api, auth):
    spec = {**DIGITS, "optimizer": {"learning_rate": 2000}, "model": {"hidden_sizes": [512] * 6}}
    job = run(api, auth, spec)
    assert job["status"] == "failed" and job["error"]["type"] == "nan_loss", job["error"]
    assert "in epoch 1" in job["error"]["message"] and "learning_rate" in job["error"]["message"]
    assert job["retries"] == 0 and job["last_error"] is None  # nan_loss is never retried
    event = final_event(api, auth, job["id"])
    assert event["status"] == "failed" and event["error"]["type"] == "nan_loss"


def test_a_tiny_max_runtime_fails_as_timeout(api, auth):
    job = run(api, auth, {**DIGITS, "epochs": 1000, "batch_size": 16, "max_runtime_s": 0.01})
    assert job["status"] == "failed" and job["error"]["type"] == "timeout", job["error"]
    assert "max_runtime_s=0.01" in job["error"]["message"]
    assert final_event(api, auth, job["id"])["error"]["type"] == "timeout"


def test_missing_data_fails_as_data_error_with_its_cause(api, auth, monkeypatch, tmp_path):
    without_fashion_mnist(monkeypatch, tmp_path)
    job = run(api, auth, FASHION)
    assert job["status"] == "failed", job
    assert job["error"]["type"] == "data_error" and job["error"]["reason"] == "data_not_found"
    assert "apt-get install dataset-fashion-mnist" in job["error"]["message"]  # what to do
    assert str(tmp_path) not in job["error"]["message"]  # never a server path
    event = final_event(api, auth, job["id"])
    assert (event["error"]["type"], event["error"]["reason"]) == ("data_error", "data_not_found")


def test_a_stored_spec_the_worker_cannot_validate_fails_as_invalid_spec(api, auth, monkeypatch):
    """A spec that the API accepted but this worker refuses (a worker of another version, whose
    limits differ): invalid_spec, naming the field."""
    from pydantic import Field

    from trainers.spec import JobSpec
    from workers import runner

    class NewerJobSpec(JobSpec):
        batch_size: int = Field(128, le=64)

    monkeypatch.setattr(runner, "JobSpec", NewerJobSpec)
    job = run(api, auth, DIGITS)
    assert job["status"] == "failed", job
    assert job["error"]["type"] == "invalid_spec" and job["error"]["reason"] == "spec_invalid"
    assert "batch_size" in job["error"]["message"] and "64" in job["error"]["message"]


def test_an_unexpected_exception_is_internal_with_only_a_reference(api, auth, monkeypatch):
    from workers import runner

    def broken(*args, **kwargs):
        raise KeyError("/srv/secret/path SELECT * FROM jobs")

    monkeypatch.setattr(runner.trainers, "fit", broken)
    job = run(api, auth, DIGITS)
    assert job["status"] == "failed" and job["error"]["type"] == "internal"
    assert "reference" in job["error"]["message"] and "/srv" not in job["error"]["message"]


# --- the classifier ---------------------------------------------------------------------------


def test_out_of_memory_is_recognised_from_each_framework():
    import torch

    from app.failures import FailureType, classify

    try:
        from jax.errors import JaxRuntimeError as XlaError
    except ImportError:  # older jax
        from jaxlib.xla_extension import XlaRuntimeError as XlaError

    xla = XlaError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 17179869184 bytes.")
    cases = [
        (MemoryError(), "gpu", "host"),
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), "gpu", "device"),
        (torch.cuda.OutOfMemoryError("CUDA out of memory"), "gpu", "device"),
        (xla, "gpu", "device"),
        (xla, "cpu", "host"),  # XLA's cpu backend allocates host memory
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB"), "cpu", "host"),
    ]
    for exc, hardware, where in cases:
        failure = classify(exc, hardware)
        assert failure is not None and failure.type == FailureType.OUT_OF_MEMORY, exc
        assert failure.reason == where, exc
        assert "batch_size" in failure.message  # what to change
    gpu = classify(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), "gpu")
    assert "gpu device memory" in gpu.message and "Tried to allocate 20.00 GiB" in gpu.message
    # Wrapped by whoever caught it: the cause still counts.
    try:
        try:
            raise MemoryError
        except MemoryError as inner:
            raise RuntimeError("batch failed") from inner
    except RuntimeError as outer:
        assert classify(outer).type == FailureType.OUT_OF_MEMORY
    assert classify(RuntimeError("something else")) is None  # internal
    assert classify(ValueError("out of memory")) is None  # only runtime errors speak for a framework


def test_a_data_parallel_rank_out_of_memory_keeps_its_class():
    from app.failures import FailureType, classify
    from trainers.torch_ddp import _error

    payload = {"rank": 1, "type": "OutOfMemoryError", "message": "CUDA out of memory. Tried to allocate 2 GiB"}
    failure = classify(_error(payload), "gpu")
    assert failure.type == FailureType.OUT_OF_MEMORY and failure.reason == "device"
    assert classify(_error({**payload, "type": "MemoryError"}), "cpu").reason == "host"


def test_each_user_error_maps_to_its_class():
    from app.failures import FailureType, SpecNotRunnable, classify
    from trainers.base import HardwareMismatch, NanLoss
    from trainers.data import DataNotFound
    from trainers.dataset_file import BadDatasetFile
    from trainers.layers import LayerError
    from workers.dataset_cache import DatasetCorrupt

    cases = {
        NanLoss(2, float("nan")): (FailureType.NAN_LOSS, None),
        HardwareMismatch("gpu", "cpu", "jax"): (FailureType.HARDWARE_MISMATCH, None),
        DataNotFound("get it"): (FailureType.DATA_ERROR, "data_not_found"),
        DatasetCorrupt("s3://b/k", "aa", "bb"): (FailureType.DATA_ERROR, "dataset_corrupt"),
        BadDatasetFile("not a dataset: /srv/x"): (FailureType.DATA_ERROR, "dataset_unreadable"),
        LayerError("model.layers[3] (conv2d): a 5x5 kernel is larger than the 4x4 image"): (
            FailureType.INVALID_SPEC,
            "model_does_not_fit",
        ),
        SpecNotRunnable("epochs: too big"): (FailureType.INVALID_SPEC, "spec_invalid"),
    }
    for exc, (kind, reason) in cases.items():
        failure = classify(exc)
        assert (failure.type, failure.reason) == (kind, reason), exc
        assert "/srv" not in failure.message and "s3://" not in failure.message


def test_an_older_workers_types_read_as_the_closed_list(api, auth):
    """A job failed by a worker from before the list (or one still running during an upgrade)."""
    from app import lifecycle
    from app.db import session_scope
    from workers import runner

    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    attempt = runner.claim(job["id"], WORKER)[2]
    with session_scope() as session:
        old = {"type": "dataset_corrupt", "message": "upload it again"}
        assert lifecycle.finish(session, job["id"], attempt, lifecycle.JobStatus.FAILED, error=old)
    error = api.get(f"/jobs/{job['id']}", headers=auth).json()["error"]
    assert error == {"type": "data_error", "reason": "dataset_corrupt", "message": "upload it again"}
    assert final_event(api, auth, job["id"])["error"]["type"] == "data_error"


def test_the_openapi_schema_lists_the_error_types(api):
    from app.failures import FailureType

    schemas = api.get("/openapi.json").json()["components"]["schemas"]
    kind = schemas["JobError"]["properties"]["type"]
    enum = kind.get("enum") or schemas[kind["$ref"].rsplit("/", 1)[-1]]["enum"]
    assert sorted(enum) == sorted(t.value for t in FailureType)
    assert sorted(enum) == sorted(["nan_loss", "out_of_memory", "hardware_mismatch", "worker_lost", "timeout",
                                   "data_error", "invalid_spec", "user_code_error", "internal"])


# --- the retry policy -------------------------------------------------------------------------


def test_the_retry_policy_setting_is_validated_naming_it(monkeypatch):
    from pydantic import ValidationError

    from app.config import Settings
    from app.failures import FailureType

    monkeypatch.delenv("TRAINHUB_MAX_ATTEMPTS", raising=False)
    assert Settings().retries_for(FailureType.WORKER_LOST) == 2  # today's max_attempts=3
    assert Settings().retries_for(FailureType.OUT_OF_MEMORY) == 0
    monkeypatch.setenv("TRAINHUB_RETRY_POLICY", "worker_lost=1, out_of_memory=3")
    settings = Settings()
    assert settings.retries_for(FailureType.WORKER_LOST) == 1 and settings.retries_for(FailureType.OUT_OF_MEMORY) == 3
    monkeypatch.setenv("TRAINHUB_RETRY_POLICY", "out_of_memory=1")  # worker_lost keeps its default
    assert Settings().retries_for(FailureType.WORKER_LOST) == 2
    for bad, said in [
        ("oom=1", "'oom' is not a failure type"),
        ("nan_loss=1", "nan_loss cannot be retried"),
        ("timeout=2", "timeout cannot be retried"),
        ("worker_lost", "is not TYPE=COUNT"),
        ("worker_lost=two", "whole number"),
        ("worker_lost=-1", "whole number"),
        ("worker_lost=1,worker_lost=2", "given twice"),
    ]:
        monkeypatch.setenv("TRAINHUB_RETRY_POLICY", bad)
        with pytest.raises(ValidationError, match="TRAINHUB_RETRY_POLICY") as raised:
            Settings()
        assert said in str(raised.value), bad


def test_max_attempts_still_works_and_says_it_is_deprecated(monkeypatch, caplog):
    from pydantic import ValidationError

    from app.config import Settings
    from app.failures import FailureType

    monkeypatch.delenv("TRAINHUB_RETRY_POLICY", raising=False)
    monkeypatch.setenv("TRAINHUB_MAX_ATTEMPTS", "5")
    with caplog.at_level("WARNING"):
        assert Settings().retries_for(FailureType.WORKER_LOST) == 4
    assert "TRAINHUB_RETRY_POLICY=worker_lost=4" in caplog.text
    monkeypatch.setenv("TRAINHUB_RETRY_POLICY", "worker_lost=1")
    with pytest.raises(ValidationError, match="drop TRAINHUB_MAX_ATTEMPTS"):
        Settings()


def test_a_retried_failure_goes_back_to_queued_and_then_succeeds(api, auth, monkeypatch, tmp_path):
    """data_error=1: the first attempt finds no data and goes back to the queue, saying why; the
    data is there for the second, which succeeds, showing the failure it was retried after."""
    from workers import runner

    policy(monkeypatch, "data_error=1")
    with monkeypatch.context() as offline:
        without_fashion_mnist(offline, tmp_path)
        job = api.post("/jobs", json=FASHION, headers=auth).json()
        assert runner.run(job["id"], WORKER, serves=["cpu.jax"]) == "queued"
    waiting = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert waiting["status"] == "queued" and waiting["error"] is None
    assert waiting["retries"] == 1 and waiting["attempts"] == 1
    assert (waiting["last_error"]["type"], waiting["last_error"]["reason"]) == ("data_error", "data_not_found")
    assert waiting["waiting_reason"].startswith("retry 1 after data_error (")
    assert runner.run(job["id"], WORKER, serves=["cpu.jax"]) == "succeeded"
    done = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert done["status"] == "succeeded" and done["error"] is None and len(done["metrics"]) == 1
    assert done["retries"] == 1 and done["last_error"]["type"] == "data_error"
    assert final_event(api, auth, job["id"])["retries"] == 1


def test_a_retried_failure_ends_failed_once_the_policy_is_spent(api, auth, monkeypatch, tmp_path):
    from workers import runner

    policy(monkeypatch, "data_error=2")
    without_fashion_mnist(monkeypatch, tmp_path)
    job = api.post("/jobs", json=FASHION, headers=auth).json()
    assert [runner.run(job["id"], WORKER, serves=["cpu.jax"]) for _ in range(3)] == ["queued", "queued", "failed"]
    failed = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert failed["status"] == "failed" and failed["retries"] == 2 and failed["attempts"] == 3
    assert (failed["error"]["type"], failed["error"]["reason"]) == ("data_error", "data_not_found")
    assert failed["last_error"]["type"] == "data_error"


def test_an_out_of_memory_failure_is_retried_as_the_policy_says(api, auth, monkeypatch):
    """The retry transition with a real out-of-memory failure (the classifier's, of a MemoryError):
    back to queued once, resumed by the next claim, then failed with it."""
    from app import lifecycle
    from app.db import session_scope
    from app.failures import classify
    from workers import runner

    policy(monkeypatch, "out_of_memory=1")
    oom = runner.failure_of("-", MemoryError("cannot allocate the batch"), WORKER)
    assert oom == classify(MemoryError("cannot allocate the batch"))
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    claimed = runner.claim(job["id"], WORKER)
    assert claimed is not None and claimed[0] == job["id"]
    assert runner.fail(job["id"], claimed[2], oom) == "queued"
    with session_scope() as session:  # the attempt that was retried cannot end the job any more
        assert lifecycle.finish(session, job["id"], claimed[2], lifecycle.JobStatus.SUCCEEDED) is False
    retried = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert retried["status"] == "queued" and retried["retries"] == 1
    assert retried["last_error"] == {"type": "out_of_memory", "reason": "host", "message": oom.message}
    assert retried["waiting_reason"].startswith("retry 1 after out_of_memory (the job ran out of host memory")
    again = runner.claim(job["id"], WORKER)
    assert again is not None and again[2] == 2
    assert runner.fail(job["id"], again[2], oom) == "failed"
    failed = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert failed["status"] == "failed" and failed["retries"] == 1
    assert failed["error"] == {"type": "out_of_memory", "reason": "host", "message": oom.message}


def test_a_cancel_asked_meanwhile_is_not_retried(api, auth, monkeypatch):
    from app import lifecycle
    from app.db import session_scope
    from workers import runner

    policy(monkeypatch, "out_of_memory=1")
    job = api.post("/jobs", json=DIGITS, headers=auth).json()
    attempt = runner.claim(job["id"], WORKER)[2]
    with session_scope() as session:
        lifecycle.cancel(session, job["id"])  # running: flagged
    assert runner.fail(job["id"], attempt, runner.failure_of("-", MemoryError(), WORKER)) == "failed"
    assert api.get(f"/jobs/{job['id']}", headers=auth).json()["retries"] == 0


def test_a_lost_worker_is_retried_as_the_policy_says_then_fails_as_worker_lost(api, auth, monkeypatch):
    from datetime import timedelta

    from app.db import session_scope
    from app.models import Job, utcnow
    from workers import reconciler, runner

    policy(monkeypatch, "worker_lost=1")
    job = api.post("/jobs", json=DIGITS, headers=auth).json()

    def lose() -> None:  # claimed by a worker that never beats its heartbeat again
        runner.claim(job["id"], {**WORKER, "name": "test:gone"})
        with session_scope() as session:
            session.execute(update(Job).where(Job.id == job["id"]).values(started_at=utcnow() - timedelta(hours=1)))
            session.commit()
        reconciler.requeue_lost_jobs()

    lose()
    retried = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert retried["status"] == "queued" and retried["retries"] == 1
    assert retried["last_error"]["type"] == "worker_lost"
    assert "test:gone" not in retried["last_error"]["message"]  # the user sees an alias, not the host
    assert retried["waiting_reason"].startswith("retry 1 after worker_lost")
    lose()
    failed = api.get(f"/jobs/{job['id']}", headers=auth).json()
    assert failed["status"] == "failed" and failed["error"]["type"] == "worker_lost"
    assert "lost 2 time(s)" in failed["error"]["message"] and "worker_lost=1" in failed["error"]["message"]
    assert final_event(api, auth, job["id"])["error"]["type"] == "worker_lost"


def test_migration_0020_puts_stored_jobs_in_the_lists_terms(tmp_path):
    """On the embedded database (SQLite): an older worker's types get the list's, and the attempts a
    lost worker left counted become worker_lost retries that the policy goes on counting."""
    import json

    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from app.db import MIGRATIONS_DIR, make_engine

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(url)

    def upgrade(to: str) -> None:
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        config.set_main_option("sqlalchemy.url", url)
        with engine.begin() as connection:
            config.attributes["connection"] = connection
            command.upgrade(config, to)

    upgrade("0019")
    stored = {"a": ({"type": "data_not_found", "message": "get it"}, 1), "b": ({"type": "nan_loss", "message": "lr"}, 1),
              "c": ({"type": "RuntimeError", "message": "boom"}, 1), "d": ({"type": "worker_lost", "message": "x"}, 3)}
    with engine.begin() as connection:
        connection.execute(text("INSERT INTO api_keys (id, name, prefix, key_hash, created_at, is_admin, scrape_only) "
                                "VALUES ('k', 'k', 'p', 'h', CURRENT_TIMESTAMP, false, false)"))
        for job_id, (error, attempts) in stored.items():
            connection.execute(text(
                "INSERT INTO jobs (id, owner_id, status, framework, hardware, devices, spec, epochs, epoch, created_at, "
                "attempts, cancel_requested, error, priority, preempted) VALUES (:id, 'k', 'failed', 'jax', 'cpu', 1, "
                "'{}', 1, 0, CURRENT_TIMESTAMP, :attempts, false, :error, 1, 0)"),
                {"id": job_id, "attempts": attempts, "error": json.dumps(error)})
    upgrade("head")
    with engine.begin() as connection:
        rows = {job_id: (json.loads(error), retries, json.loads(counts) if counts else None) for job_id, error, retries, counts
                in connection.execute(text("SELECT id, error, retries, retry_counts FROM jobs"))}
    engine.dispose()
    assert rows["a"] == ({"type": "data_error", "reason": "data_not_found", "message": "get it"}, 0, None)
    assert rows["b"] == ({"type": "nan_loss", "message": "lr"}, 0, None)  # already in the list: untouched
    assert rows["c"] == ({"type": "internal", "reason": "RuntimeError", "message": "boom"}, 0, None)
    assert rows["d"] == ({"type": "worker_lost", "message": "x"}, 2, {"worker_lost": 2})
