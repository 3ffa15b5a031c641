"""Comparisons: one spec trained in JAX and in PyTorch, and the side-by-side table."""

from __future__ import annotations

import statistics

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import jobs, limits
from app.keys import Caller
from app.models import Comparison, Job, aware, utcnow
from trainers.spec import ComparisonSpec, parameter_count

FRAMEWORKS = ("jax", "pytorch")

# (row name, where its value comes from). Times in seconds; samples_per_s is the median over
# the epochs after the first, like steady_epoch_s.
TABLE_ROWS = ("parameters", "compile_s", "first_epoch_s", "steady_epoch_s", "samples_per_s",
              "test_accuracy", "test_loss")


def create_comparison(session: Session, owner: Caller, spec: ComparisonSpec) -> Comparison:
    """Store both jobs and the comparison in one transaction, then enqueue the jobs. Raises
    limits.QuotaExceeded when the key may not add two jobs now."""
    jax_job, torch_job = (jobs.new_job(owner, spec.for_framework(fw)) for fw in FRAMEWORKS)
    session.add_all([jax_job, torch_job])
    session.flush()
    comparison = Comparison(owner_id=owner.id, spec=spec.model_dump(mode="json"),
                            jax_job_id=jax_job.id, pytorch_job_id=torch_job.id, created_at=jax_job.created_at)
    session.add(comparison)
    session.flush()
    limits.check_quota(session, owner, len(FRAMEWORKS))
    session.commit()
    for job in (jax_job, torch_job):
        jobs.enqueue(session, job)
    return comparison


def get_comparison(session: Session, owner: Caller, comparison_id: str) -> Comparison | None:
    """The owner's comparison (any for an admin key) by id or short id, as jobs.find_owned; else None."""
    return jobs.find_owned(session, owner, Comparison, comparison_id)


def list_comparisons(session: Session, owner: Caller, limit: int) -> list[Comparison]:
    query = select(Comparison) if owner.is_admin else select(Comparison).where(Comparison.owner_id == owner.id)
    return list(session.scalars(query.order_by(Comparison.created_at.desc()).limit(limit)))


def cancel_comparison(session: Session, comparison: Comparison) -> None:
    """Cancel both jobs; a side that already ended stays as it ended."""
    for job in (comparison.jax_job, comparison.pytorch_job):
        try:
            jobs.cancel_job(session, job)
        except jobs.CannotCancel:
            pass


def status_and_error(comparison: Comparison) -> tuple[str, dict | None]:
    """The comparison's status, and the error that ended it (a side's, or the parity check's)."""
    sides = {"jax": comparison.jax_job, "pytorch": comparison.pytorch_job}
    for framework, job in sides.items():
        if job.status == "failed":
            return "failed", {"framework": framework, **(job.error or {"type": "failed", "message": ""})}
    if any(job.status == "cancelled" for job in sides.values()):
        return "cancelled", None
    if all(job.status == "succeeded" for job in sides.values()):
        if comparison.parity is None:
            return "running", None  # the parity check is being computed
        if not comparison.parity["passed"]:
            return "failed", {"framework": None, "type": "parity_mismatch", "message": comparison.parity["message"]}
        return "succeeded", None
    if all(job.status == "queued" for job in sides.values()):
        return "queued", None
    return "running", None


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


def table(comparison: Comparison) -> list[dict]:
    """The side-by-side rows: {"metric", "jax", "pytorch", "ratio"} with ratio = jax / pytorch."""
    spec = ComparisonSpec.model_validate(comparison.spec)
    values = {fw: _values(job, parameter_count(spec)) for fw, job in
              (("jax", comparison.jax_job), ("pytorch", comparison.pytorch_job))}
    rows = []
    for metric in TABLE_ROWS:
        jax_value, torch_value = values["jax"].get(metric), values["pytorch"].get(metric)
        ratio = jax_value / torch_value if jax_value is not None and torch_value else None
        rows.append({"metric": metric, "jax": jax_value, "pytorch": torch_value, "ratio": ratio})
    return rows


def _values(job: Job, parameters: int) -> dict:
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
    }
