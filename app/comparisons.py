"""Comparisons: one spec trained in JAX and in PyTorch (created, found, listed, cancelled).

Their status, side-by-side table and HTTP answer are computed in app/rendering.py."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import jobs, limits, pages
from app.keys import Caller
from app.models import Comparison
from trainers.spec import FRAMEWORKS, ComparisonSpec


def create_comparison(session: Session, owner: Caller, spec: ComparisonSpec) -> Comparison:
    """Store both jobs and the comparison in one transaction, then enqueue the jobs. Raises
    limits.QuotaExceeded when the key may not add two jobs now."""
    jax_job, torch_job = (jobs.new_job(owner, spec.for_framework(fw)) for fw in FRAMEWORKS)
    session.add_all([jax_job, torch_job])
    session.flush()
    comparison = Comparison(
        owner_id=owner.id,
        spec=spec.model_dump(mode="json"),
        jax_job_id=jax_job.id,
        pytorch_job_id=torch_job.id,
        created_at=jax_job.created_at,
    )
    session.add(comparison)
    session.flush()
    limits.commit_within_quota(session, owner, len(FRAMEWORKS))
    for job in (jax_job, torch_job):
        jobs.enqueue(session, job)
    return comparison


def get_comparison(session: Session, owner: Caller, comparison_id: str) -> Comparison | None:
    """The owner's comparison (any for an admin key) by id or short id, as jobs.find_owned; else None."""
    return jobs.find_owned(session, owner, Comparison, comparison_id)


def list_comparisons(
    session: Session, owner: Caller, limit: int, cursor: str | None
) -> tuple[list[Comparison], str | None]:
    """The owner's comparisons (every one for an admin key) newest first, and the cursor of the
    next page (None on the last). Raises ValueError for a cursor this API did not hand out."""
    query = select(Comparison) if owner.is_admin else select(Comparison).where(Comparison.owner_id == owner.id)
    return pages.page(session, query, Comparison, limit, cursor)


def cancel_comparison(session: Session, comparison: Comparison) -> None:
    """Cancel both jobs; a side that already ended stays as it ended."""
    for job in (comparison.jax_job, comparison.pytorch_job):
        try:
            jobs.cancel_job(session, job)
        except jobs.CannotCancel:
            pass
