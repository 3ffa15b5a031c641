"""What datasets and code uploads share: records over content-addressed files (several records,
one file per sha256), deleted only while nothing will still train on them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import InstrumentedAttribute, Session

from app import storage
from app.config import Settings
from app.models import Job, Sweep
from app.status import JobStatus, SweepStatus


class InUse(Exception):
    """The record is used by queued or running jobs, or by running sweeps whose later trials
    train on it (409); `jobs` and `sweeps` their ids."""

    def __init__(self, jobs: list[str], sweeps: list[str]) -> None:
        super().__init__(jobs, sweeps)
        self.jobs = jobs
        self.sweeps = sweeps

    def detail(self, what: str) -> str:
        """The 409's message: `what` (e.g. "dataset ds_…") and who uses it, at most 5 of each."""

        def some(ids: list[str]) -> str:
            return ", ".join(ids[:5]) + (" ..." if len(ids) > 5 else "")

        users = [f"{len(self.jobs)} queued or running job(s) ({some(self.jobs)})"] if self.jobs else []
        users += [f"{len(self.sweeps)} running sweep(s) ({some(self.sweeps)})"] if self.sweeps else []
        return f"{what} is used by {' and '.join(users)}: cancel them or wait for them to finish"


def lock_content(session: Session, sha256: str) -> None:
    """Serialise the writers of one content's stored file (store and delete) for the rest of the
    transaction: a delete never removes a file a concurrent upload of the same content has just
    recorded. PostgreSQL: a transaction-level advisory lock; SQLite serialises writers itself."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:sha256, 0))"), {"sha256": sha256})


def delete(
    session: Session,
    row: Any,
    job_column: InstrumentedAttribute,
    base_uses: Callable[[dict[str, Any]], bool],
    settings: Settings,
) -> None:
    """Delete the record `row` (a Dataset or CodeUpload: id, sha256, location, owner_id), and its
    stored file when no other record shares it. Raises InUse while a queued or running job names
    it in `job_column`, or a running sweep of its owner has a base spec that `base_uses`."""
    model = type(row)
    lock_content(session, row.sha256)
    session.execute(select(model.id).where(model.id == row.id).with_for_update())
    active = list(
        session.scalars(
            select(Job.id).where(job_column == row.id, Job.status.in_([JobStatus.QUEUED, JobStatus.RUNNING]))
        )
    )
    running = select(Sweep).where(Sweep.owner_id == row.owner_id, Sweep.status == SweepStatus.RUNNING)
    sweeps = [sweep.id for sweep in session.scalars(running) if base_uses(sweep.spec.get("base") or {})]
    if active or sweeps:
        session.rollback()
        raise InUse(active, sweeps)
    sha256, location = row.sha256, row.location
    session.delete(row)
    session.flush()
    shared = session.scalar(select(func.count()).select_from(model).where(model.sha256 == sha256))
    session.commit()
    if not shared:
        storage.store_for(location, settings).delete(location)
