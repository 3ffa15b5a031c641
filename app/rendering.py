"""Rows as HTTP answers: a job (with its waiting reason and queue position), its metrics and
artifacts, and a comparison (its status, side-by-side table and parity), built on app/schemas.py."""

from __future__ import annotations

import functools
import hashlib
import json
import statistics

from sqlalchemy.orm import Session

from app import failures, jobs
from app.config import get_settings
from app.lifecycle import FINISHED, JobStatus
from app.models import Artifact, Comparison, EpochMetric, Job, aware, utcnow
from app.schemas import Comparison as ComparisonOut
from app.schemas import Job as JobOut
from trainers.base import METRIC_FIELDS
from trainers.spec import ComparisonSpec, JobSpec, model_plan, parameter_count

# The side-by-side table's rows. Times in seconds; samples_per_s is the median over the epochs
# after the first, like steady_epoch_s.
TABLE_ROWS = (
    "parameters",
    "compile_s",
    "first_epoch_s",
    "steady_epoch_s",
    "samples_per_s",
    "test_accuracy",
    "test_loss",
    "test_rmse",
    "test_mae",
    "test_r2",
)
# Rows only one task has: accuracy for classification, the others for regression.
TASK_ROWS = frozenset({"test_accuracy", "test_rmse", "test_mae", "test_r2"})


def worker_alias(name: str) -> str:
    """A worker's name as a user key sees it: stable (the same worker, the same alias), and
    saying nothing of the host or process (an admin key sees `hostname:pid:instance`)."""
    return "worker-" + hashlib.sha256(name.encode()).hexdigest()[:10]


# What a user key sees of the worker that ran a job: what it ran on, not where.
_PUBLIC_WORKER_FIELDS = ("hardware", "devices", "versions", "backend")


def job_worker(worker: dict | None, admin: bool) -> dict | None:
    """The job's `worker` as the caller may see it: whole for an admin key; else its alias,
    hardware, devices, versions and backend (no hostname, pid or instance)."""
    if worker is None or admin:
        return worker
    public = {key: worker[key] for key in _PUBLIC_WORKER_FIELDS if key in worker}
    return {"name": worker_alias(str(worker.get("name", ""))), **public}


def public_base() -> str:
    """What artifact URLs start with: Settings.public_url, or nothing (relative URLs). Never the
    request's Host header, which a client chooses."""
    return (get_settings().public_url or "").rstrip("/")


def job(
    session: Session,
    row: Job,
    base_url: str,
    served: set[str] | None = None,
    position: int | None = None,
    admin: bool = False,
) -> JobOut:
    """Render a row as the HTTP Job; `base_url` prefixes artifact URLs. `served` (online_queues)
    and `position` (queue_position): when the caller has them already (read here otherwise).
    `admin`: whether the caller's key is an admin key (it sees where the job ran: job_worker)."""
    if served is None:
        served = jobs.online_queues(session) if row.status == JobStatus.QUEUED else set()
    url = base_url.rstrip("/")
    if position is None:
        position = jobs.queue_position(session, row)
    started = row.started_at is not None  # metrics and artifacts come from a worker running the job
    return JobOut.model_validate(
        {
            "id": row.id,
            "status": row.status,
            "spec": row.spec,
            "created_at": row.created_at,
            "started_at": row.started_at,
            "finished_at": row.finished_at,
            "waiting_reason": jobs.waiting_reason(session, row, served, position),
            "queue_position": position,
            "attempts": row.attempts,
            "preempted": row.preempted or 0,
            "progress": {"epoch": row.epoch, "epochs": row.epochs},
            "metrics": [metric(m) for m in row.metrics] if started else [],
            "timings": row.timings,
            "result": row.result,
            "error": failures.normalise(row.error) if row.status == JobStatus.FAILED else None,
            "retries": row.retries or 0,
            "last_error": failures.normalise(row.last_error),
            "artifacts": [artifact(a, f"{url}/jobs/{row.id}/artifacts/{a.name}") for a in row.artifacts]
            if started
            else [],
            "worker": job_worker(row.worker, admin),
            "model": model_summary(json.dumps(row.spec, sort_keys=True)),
            "sweep": {"id": row.sweep_id, "trial": row.trial_number, "params": row.trial_params or {}}
            if row.sweep_id
            else None,
            JobStatus.PRUNED.value: {"epoch": row.error.get("epoch", row.epoch), "reason": row.error.get("message", "")}
            if row.status == JobStatus.PRUNED and row.error
            else None,
        }
    )


@functools.lru_cache(maxsize=4096)
def model_summary(spec_json: str) -> dict[str, int] | None:
    """{"parameters", "flops_per_example"} of a stored spec's model (cached by the spec: many jobs
    share one, and a list renders each); None for a spec that no longer validates."""
    try:
        walked = model_plan(JobSpec.model_validate_json(spec_json))
    except ValueError:
        return None
    return {"parameters": walked.parameters, "flops_per_example": walked.flops}


def metric(row: EpochMetric) -> dict:
    """An epoch's metrics row as the HTTP EpochMetrics: its METRIC_FIELDS."""
    return {name: getattr(row, name) for name in METRIC_FIELDS}


def artifact(artifact: Artifact, url: str) -> dict:
    return {"name": artifact.name, "size_bytes": artifact.size_bytes, "sha256": artifact.sha256, "url": url}


def comparison(session: Session, row: Comparison, base_url: str, admin: bool = False) -> ComparisonOut:
    """A comparison with both jobs, its status and error, the table once both succeeded, the parity
    check and how long the two jobs overlapped."""
    state, error = comparison_status(row)
    served = jobs.online_queues(session)
    return ComparisonOut(
        id=row.id,
        status=state,
        spec=row.spec,
        created_at=row.created_at,
        jobs={
            fw: job(session, side, base_url, served, admin=admin)
            for fw, side in (("jax", row.jax_job), ("pytorch", row.pytorch_job))
        },
        table=comparison_table(row) if state == JobStatus.SUCCEEDED else None,
        parity=row.parity,
        error=error,
        overlap_s=overlap_s(row),
    )


def comparison_status(comparison: Comparison) -> tuple[JobStatus, dict | None]:
    """The comparison's status, and the error that ended it (a side's, or the parity check's)."""
    sides = {"jax": comparison.jax_job, "pytorch": comparison.pytorch_job}
    for framework, job in sides.items():
        if job.status == JobStatus.FAILED:
            return JobStatus.FAILED, {
                "framework": framework,
                **(
                    failures.normalise(job.error)
                    or {"type": "internal", "message": "the job failed without a recorded error"}
                ),
            }
    if any(job.status == JobStatus.CANCELLED for job in sides.values()):
        return JobStatus.CANCELLED, None
    if any(job.status == JobStatus.PRUNED for job in sides.values()) and all(
        job.status in FINISHED for job in sides.values()
    ):
        return JobStatus.PRUNED, None  # a sweep's trial in both frameworks, stopped by its pruner
    if all(job.status == JobStatus.SUCCEEDED for job in sides.values()):
        if comparison.parity is None:
            return JobStatus.RUNNING, None  # the parity check is being computed
        if not comparison.parity["passed"]:
            return JobStatus.FAILED, {
                "framework": None,
                "type": "parity_mismatch",
                "message": comparison.parity["message"],
            }
        return JobStatus.SUCCEEDED, None
    if all(job.status == JobStatus.QUEUED for job in sides.values()):
        return JobStatus.QUEUED, None
    return JobStatus.RUNNING, None


def overlap_s(comparison: Comparison) -> float | None:
    """Seconds both jobs were running at once (started to finished, or to now for one still
    running); None until both have started."""
    jax_job, torch_job = comparison.jax_job, comparison.pytorch_job
    if jax_job.started_at is None or torch_job.started_at is None:
        return None
    now = utcnow()
    start = max(aware(jax_job.started_at), aware(torch_job.started_at))
    end = min(aware(jax_job.finished_at or now), aware(torch_job.finished_at or now))
    return max(0.0, (end - start).total_seconds())


def comparison_table(comparison: Comparison) -> list[dict]:
    """The side-by-side rows: {"metric", "jax", "pytorch", "ratio"} with ratio = jax / pytorch."""
    spec = ComparisonSpec.model_validate(comparison.spec)
    parameters = None if spec.model.user_code else parameter_count(spec)  # user code: known in its sandbox only
    values = {
        fw: _values(job, parameters) for fw, job in (("jax", comparison.jax_job), ("pytorch", comparison.pytorch_job))
    }
    rows = []
    for metric in TABLE_ROWS:
        jax_value, torch_value = values["jax"].get(metric), values["pytorch"].get(metric)
        if metric in TASK_ROWS and jax_value is None and torch_value is None:
            continue  # a score of the other task
        ratio = jax_value / torch_value if jax_value is not None and torch_value else None
        rows.append({"metric": metric, "jax": jax_value, "pytorch": torch_value, "ratio": ratio})
    return rows


def _values(job: Job, parameters: int | None) -> dict:
    timings, result = job.timings or {}, job.result or {}
    # Epochs 2..n, as steady_epoch_s (the first when alone); their median, as steady_epoch_s's.
    later = [m.samples_per_s for m in job.metrics[1:]] or [m.samples_per_s for m in job.metrics]
    return {
        "parameters": parameters,
        "compile_s": timings.get("compile_s"),
        "first_epoch_s": timings.get("first_epoch_s"),
        "steady_epoch_s": timings.get("steady_epoch_s"),
        "samples_per_s": statistics.median(later) if later else None,
        "test_accuracy": result.get("test_accuracy"),
        "test_loss": result.get("test_loss"),
        "test_rmse": result.get("test_rmse"),
        "test_mae": result.get("test_mae"),
        "test_r2": result.get("test_r2"),
    }
