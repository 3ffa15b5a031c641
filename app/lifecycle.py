"""A job's lifecycle: its status values and every transition of its row, side by side.

The row is the source of truth and every transition is one compare-and-set UPDATE, fenced so
that two actors racing for the same row (a cancel and a claim, a release and a reconciler) can
never both win. A worker's writes are fenced by the attempt number its claim took: once the row
moved on without it (the reconciler handed the job to another worker), they no longer apply.

| transition     | from                  | to                             | by          | fence                     |
|----------------|-----------------------|--------------------------------|-------------|---------------------------|
| claim          | queued                | running (attempts + 1)         | worker      | status = queued           |
| record_epoch   | running               | running (epoch = k)            | worker      | attempts = its attempt    |
| finish         | running               | succeeded / failed / cancelled | worker      | running, its attempt      |
| release        | running               | queued (attempts - 1), or      | worker      | running, its attempt      |
|                |                       | cancelled when a cancel came   |             |                           |
| preempt        | running               | queued (attempts - 1,          | worker      | running, its attempt      |
|                |                       | preempted + 1), or cancelled   |             |                           |
| cancel         | queued                | cancelled                      | API         | status = queued           |
|                | running               | running, cancel_requested      | API         | status = running          |
| retry          | running, no cancel    | queued (retries + 1,           | worker,     | running, its attempt (or  |
|                | asked, a retry left   | last_error), resumes           | reconciler  | the one seen), retries    |
| fail_lost      | running               | failed (worker_lost)           | reconciler  | running, the attempt seen |
| cancel_lost    | running, cancel asked | cancelled                      | reconciler  | running, the attempt seen |
| stamp_enqueued | queued                | queued (enqueued_at = now)     | API, worker | (no status change)        |

`retry` is how a failure that the retry policy retries (app/failures.py, TRAINHUB_RETRY_POLICY)
sends a job back: a lost worker's job (the reconciler) or one whose attempt failed with, e.g.,
out_of_memory (its worker). Its attempt stays counted, and it resumes from its last checkpoint.

Each function executes its statement on the caller's session and commits; it returns whether
(or how) the row changed, so the caller knows whether it won.
"""

from __future__ import annotations

from datetime import datetime
from typing import cast

from sqlalchemy import CursorResult, Row, Table, Update, bindparam, case, select, update
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement

from app.failures import Failure, FailureType
from app.models import Job, utcnow
from app.status import ACTIVE, FINISHED, JobStatus

__all__ = [
    "ACTIVE",
    "FINISHED",
    "JobStatus",
    "claim",
    "record_epoch",
    "record_epoch_flags",
    "finish",
    "release",
    "preempt",
    "cancel",
    "retry",
    "fail_lost",
    "cancel_lost",
    "stamp_enqueued",
]


def _update(session: Session, statement: Update) -> int:
    """Run an UPDATE; how many rows it changed."""
    result: CursorResult = session.execute(statement)  # type: ignore[assignment]  # DML gives a CursorResult
    return result.rowcount


def _fence(job_id: str, attempt: int) -> tuple[ColumnElement[bool], ...]:
    return (Job.id == job_id, Job.status == JobStatus.RUNNING, Job.attempts == attempt)


def claim(session: Session, job_id: str, worker: dict, now: datetime) -> int | None:
    """queued -> running for `worker`; the attempt number this claim took, or None when the job
    is not queued (another worker won, a duplicate message, or it was cancelled)."""
    attempt = session.scalar(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.QUEUED)
        .values(status=JobStatus.RUNNING, started_at=now, attempts=Job.attempts + 1, worker=worker)
        .returning(Job.attempts)
    )
    session.commit()
    return attempt


def record_epoch(session: Session, job_id: str, attempt: int, epoch: int) -> bool:
    """The job's progress: `epoch` epochs done (its metrics row is added by the caller in the same
    transaction). False when this attempt no longer owns the row."""
    # (a resumed job replays the epochs after its checkpoint: its progress never goes back)
    moved = _update(
        session,
        update(Job)
        .where(Job.id == job_id, Job.attempts == attempt)
        .values(epoch=case((Job.epoch < epoch, epoch), else_=Job.epoch)),
    )
    session.commit()
    return moved == 1


def record_epoch_flags(session: Session, job_id: str, attempt: int, epoch: int) -> Row | None:
    """record_epoch, returning the row's (cancel_requested, status, attempts) after it in the same
    statement, so a worker learns of a cancel or a hand-over without reading its flags again;
    None when this attempt no longer owns the row."""
    row = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.attempts == attempt)
        .values(epoch=case((Job.epoch < epoch, epoch), else_=Job.epoch))
        .returning(Job.cancel_requested, Job.status, Job.attempts)
    ).first()
    session.commit()
    return row


def finish(session: Session, job_id: str, attempt: int, status: JobStatus, **values: object) -> bool:
    """running -> `status` (succeeded, failed or cancelled) with `values` (timings, result, error,
    worker); False when the job moved on without this attempt."""
    assert status in FINISHED, status
    moved = _update(
        session, update(Job).where(*_fence(job_id, attempt)).values(status=status, finished_at=utcnow(), **values)
    )
    session.commit()
    return moved == 1


def release(session: Session, job_id: str, attempt: int, preempted: bool = False) -> JobStatus | None:
    """A worker stopping (shutdown) hands its job back: running -> queued, the attempt not
    counted, so the next one resumes from the last checkpoint; or -> cancelled when a cancel came
    meanwhile. One statement decides, so a cancel is never lost between the two. None when the
    job moved on without this attempt. `preempted`: it gives its worker to a job of higher
    priority (its `preempted` count goes up)."""
    cancelled = Job.cancel_requested.is_(True)
    status = session.execute(
        update(Job)
        .where(*_fence(job_id, attempt))
        .values(
            status=case((cancelled, JobStatus.CANCELLED.value), else_=JobStatus.QUEUED.value),
            attempts=case((cancelled, Job.attempts), else_=Job.attempts - 1),
            finished_at=case((cancelled, utcnow()), else_=None),
            enqueued_at=None,
            preempted=Job.preempted + 1 if preempted else Job.preempted,
        )
        .returning(Job.status)
    ).scalar()
    session.commit()
    return JobStatus(status) if status else None


def preempt(session: Session, job_id: str, attempt: int) -> JobStatus | None:
    """running -> queued for a job that gives its worker to a higher-priority one (release, with
    its `preempted` count up by one); it resumes from its last checkpoint."""
    return release(session, job_id, attempt, preempted=True)


def cancel(session: Session, job_id: str) -> None:
    """A queued job is cancelled at once (it will never run); a running one is flagged, and its
    worker stops it at its next look. Finished jobs are left as they are.

    One compare-and-set whatever the row's state: a worker that claims the job, or releases it on
    shutdown, between two statements would make both miss. (PostgreSQL re-checks the WHERE
    against a row that changed while the UPDATE waited for it.)"""
    queued = Job.status == JobStatus.QUEUED
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status.in_(ACTIVE))
        .values(
            status=case((queued, JobStatus.CANCELLED.value), else_=Job.status),
            finished_at=case((queued, utcnow()), else_=Job.finished_at),
            cancel_requested=case((queued, Job.cancel_requested), else_=True),
        )
    )
    session.commit()


def retry(session: Session, job_id: str, attempt: int, error: dict, allowed: int) -> bool:
    """running -> queued after a failure (`error`, the job's error object) that the retry policy
    retries `allowed` times for its type: False, and the row left as it is, when the job already
    had that many retries of the type, a cancel was asked (the caller ends it), or the job moved
    on without this attempt. The retry is counted (retries, retry_counts) and shown (last_error);
    the job resumes from its checkpoint. Fenced by the attempt and by the retries seen, so a
    count is never spent twice."""
    seen = session.execute(
        select(Job.retries, Job.retry_counts).where(*_fence(job_id, attempt), Job.cancel_requested.is_(False))
    ).first()
    if seen is None:
        session.commit()
        return False
    retries, counts = seen
    kind = str(error["type"])
    if (counts or {}).get(kind, 0) >= allowed:
        session.commit()
        return False
    moved = _update(
        session,
        update(Job)
        .where(*_fence(job_id, attempt), Job.cancel_requested.is_(False), Job.retries == retries)
        .values(
            status=JobStatus.QUEUED,
            enqueued_at=None,
            retries=retries + 1,
            retry_counts={**(counts or {}), kind: (counts or {}).get(kind, 0) + 1},
            last_error=error,
        ),
    )
    session.commit()
    return moved == 1


def fail_lost(session: Session, job_id: str, attempt: int, message: str) -> bool:
    """running -> failed (error.type worker_lost) once the retry policy's worker_lost retries are spent."""
    error = Failure(FailureType.WORKER_LOST, message).as_error()
    moved = _update(
        session,
        update(Job).where(*_fence(job_id, attempt)).values(status=JobStatus.FAILED, finished_at=utcnow(), error=error),
    )
    session.commit()
    return moved == 1


def cancel_lost(session: Session, job_id: str, attempt: int) -> bool:
    """running -> cancelled for a lost job whose cancel was asked: it is not run again."""
    moved = _update(
        session, update(Job).where(*_fence(job_id, attempt)).values(status=JobStatus.CANCELLED, finished_at=utcnow())
    )
    session.commit()
    return moved == 1


# Built once: every POST /jobs runs it. On the table, so the ORM looks for no object to update.
_JOBS = cast(Table, Job.__table__)
_STAMP_ENQUEUED = update(_JOBS).where(_JOBS.c.id == bindparam("job_id")).values(enqueued_at=bindparam("now"))


def stamp_enqueued(session: Session, job_id: str, now: datetime) -> None:
    """Record that the job's id was handed to the broker at `now` (the reconciler trusts the stamp:
    a queued job without one is sent again). Commits; a session outside a transaction sends the
    UPDATE alone, in autocommit, without BEGIN and COMMIT round trips."""
    if not session.in_transaction():
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    session.execute(_STAMP_ENQUEUED, {"job_id": job_id, "now": now})
    session.commit()
