"""Run one job: claim its row, train, record each epoch, store artifacts, end it.

The database row is the truth: a claim is a compare-and-set from `queued` to `running`, so a
message delivered twice (or for a cancelled job) does nothing. Every later write is fenced by
the attempt number the claim took: if the reconciler handed the job to another worker (this
one was thought lost), this run's writes no longer apply and it stops at its next chunk.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from datetime import datetime
from pathlib import Path

from sqlalchemy import case, select, update
from sqlalchemy.exc import IntegrityError

import trainers
from app import jobs, storage
from app.config import get_settings
from app.db import session_scope
from app.models import Artifact, EpochMetric, Job, utcnow
from trainers.spec import JobSpec
from workers import comparisons

log = logging.getLogger(__name__)

# Set when the worker is asked to stop (SIGTERM, Ctrl-C): the job stops at its next chunk of
# steps and goes back to the queue, instead of holding the shutdown or being killed mid-epoch.
shutting_down = threading.Event()

# A running job looks at its cancel flag at most this often (seconds), between chunks of steps.
CANCEL_POLL_S = 0.5

# Error types users can act on, by exception class name; anything else keeps its own name.
ERROR_TYPES = {"DataNotFound": "data_not_found", "HardwareMismatch": "hardware_mismatch", "NanLoss": "nan_loss"}


def run(job_id: str, worker: dict, serves: list[str] | None = None) -> str:
    """Run the job if this call wins its claim; return the status it ended with, "skipped", or
    "misrouted" when its queue is not among `serves` (the queues this worker checked it can serve).

    Whatever happens after the claim, the job ends succeeded, failed or cancelled, or (when the
    worker is shutting down) goes back to queued to resume elsewhere: it is never left running."""
    if serves is not None and not serves_job(job_id, serves):
        return "misrouted"
    claimed = claim(job_id, worker)
    if claimed is None:
        log.info("job %s is not queued (duplicate delivery or cancelled); skipping", job_id)
        return "skipped"
    claimed_at, attempt = claimed
    try:
        return train(job_id, attempt, claimed_at, worker)
    except trainers.StopTraining as stop:
        if stop.reason == "cancelled":
            return finish(job_id, attempt, "cancelled")
        if stop.reason == "shutdown":
            return release(job_id, attempt)
        return finish(job_id, attempt, "failed", error={"type": stop.reason, "message": str(stop)})
    except Exception as exc:
        log.exception("job %s failed", job_id)
        kind = ERROR_TYPES.get(type(exc).__name__, type(exc).__name__)
        return finish(job_id, attempt, "failed", error={"type": kind, "message": str(exc) or repr(exc)})


def train(job_id: str, attempt: int, claimed_at: datetime, worker: dict) -> str:
    """Fit the claimed job, store its artifacts and end it succeeded."""
    with session_scope() as session:
        job = session.get(Job, job_id)
        spec = JobSpec.model_validate(job.spec)
        created_at = job.created_at
    workdir = get_settings().resolved_artifact_dir() / job_id
    hooks = JobHooks(job_id, attempt, spec.max_runtime_s)
    result = trainers.fit(spec, workdir, hooks.report, hooks.should_stop)
    store_artifacts(job_id, workdir, result.artifacts)
    timings = {
        "queue_wait_s": _seconds(created_at, claimed_at),
        **result.timings,
        "total_s": _seconds(claimed_at, utcnow()),
    }
    worker = {**worker, "backend": result.device.get("backend"), "devices": result.device.get("devices", worker.get("devices"))}
    status = finish(job_id, attempt, "succeeded", timings=timings, result=result.result, worker=worker)
    comparisons.settle(job_id)
    return status


def serves_job(job_id: str, serves: list[str]) -> bool:
    """Whether this worker may run the job. A message that reached a worker which cannot serve
    the job's `<hardware>.<framework>` (sent to the wrong queue by hand or by an older API) is
    never claimed: a gpu job must not quietly train on a cpu worker. The job stays queued and its
    id goes back to its own queue."""
    with session_scope() as session:
        job = session.get(Job, job_id)
        if job is None or job.queue in serves:
            return True  # an unknown id: claim() skips it
        log.warning("job %s needs %s, which this worker (%s) does not serve; sending it back to its queue",
                    job_id, job.queue, ", ".join(serves))
        if job.status == "queued":
            jobs.enqueue(session, job)
    return False


def claim(job_id: str, worker: dict) -> tuple[datetime, int] | None:
    """Compare-and-set the row from queued to running; (claim time, attempt number), or None if
    the job is not queued (another worker won, or it was cancelled)."""
    now = utcnow()
    with session_scope() as session:
        attempt = session.scalar(
            update(Job)
            .where(Job.id == job_id, Job.status == "queued")
            .values(status="running", started_at=now, attempts=Job.attempts + 1, worker=worker)
            .returning(Job.attempts)
        )
        session.commit()
    return (now, attempt) if attempt is not None else None


class JobHooks:
    """The trainer's callbacks for one job: record each epoch, honour cancel and max_runtime_s."""

    def __init__(self, job_id: str, attempt: int, max_runtime_s: float | None) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.deadline = time.monotonic() + max_runtime_s if max_runtime_s else None
        self.max_runtime_s = max_runtime_s
        self.last_poll = 0.0

    def report(self, epoch: int, metrics: trainers.EpochMetrics) -> None:
        """Store the epoch's metrics (once, even if reported again) and the job's progress."""
        with session_scope() as session:
            try:
                with session.begin_nested():
                    session.add(EpochMetric(job_id=self.job_id, **metrics.to_dict()))
            except IntegrityError:
                log.info("job %s epoch %d was already recorded", self.job_id, epoch)
            session.execute(update(Job).where(Job.id == self.job_id, Job.attempts == self.attempt).values(epoch=epoch))
            session.commit()
        self.should_stop(force=True)

    def should_stop(self, force: bool = False) -> None:
        """Raise StopTraining when the job was cancelled, ran past max_runtime_s, was handed
        to another worker, or this worker is shutting down."""
        if shutting_down.is_set():
            raise trainers.StopTraining("shutdown", "the worker is shutting down")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise trainers.StopTraining("timeout", f"the job ran longer than max_runtime_s={self.max_runtime_s}")
        now = time.monotonic()
        if not force and now - self.last_poll < CANCEL_POLL_S:
            return
        self.last_poll = now
        with session_scope() as session:
            row = session.execute(
                select(Job.cancel_requested, Job.status, Job.attempts).where(Job.id == self.job_id)
            ).one()
        if row.cancel_requested:
            raise trainers.StopTraining("cancelled", "cancelled by the user")
        if row.status != "running" or row.attempts != self.attempt:
            raise trainers.StopTraining("superseded", "the job was handed to another worker")


def store_artifacts(job_id: str, workdir: Path, names: list[str]) -> None:
    """Put each file the trainer wrote into the artifact store (app/storage.py: the artifact dir
    or an S3 bucket) and record where, with its size and sha256; never twice."""
    store = storage.get_store()
    with session_scope() as session:
        known = set(session.scalars(select(Artifact.name).where(Artifact.job_id == job_id)))
        for name in names:
            if name in known:
                continue
            path = workdir / name
            location = store.put(job_id, name, path)  # stored before recorded: a row always has its file
            session.add(Artifact(job_id=job_id, name=name, size_bytes=path.stat().st_size,
                                 sha256=sha256_file(path), path=location))
        session.commit()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def release(job_id: str, attempt: int) -> str:
    """Put a job this worker stops on shutdown back in its queue; the attempt does not count, and
    the next one resumes from the last checkpoint. A job whose cancel came meanwhile ends
    `cancelled` instead (its finished epochs stay): one statement decides, so a cancel is never
    lost between the two."""
    cancelled = Job.cancel_requested.is_(True)
    with session_scope() as session:
        status = session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running", Job.attempts == attempt)
            .values(status=case((cancelled, "cancelled"), else_="queued"),
                    attempts=case((cancelled, Job.attempts), else_=Job.attempts - 1),
                    finished_at=case((cancelled, utcnow()), else_=None), enqueued_at=None)
            .returning(Job.status)
        ).scalar()
        session.commit()
        if status == "queued":
            jobs.enqueue(session, session.get(Job, job_id))  # broker away: the reconciler sends it later
    log.info("job %s %s on shutdown", job_id, "released" if status == "queued" else status)
    return status or "queued"


def finish(job_id: str, attempt: int, status: str, **values) -> str:
    """End this attempt of the job with `status`, unless the job has moved on without it."""
    with session_scope() as session:
        session.execute(
            update(Job)
            .where(Job.id == job_id, Job.status == "running", Job.attempts == attempt)
            .values(status=status, finished_at=utcnow(), **values)
        )
        session.commit()
    log.info("job %s %s", job_id, status)
    return status


def _seconds(start: datetime, end: datetime) -> float:
    # SQLite hands back naive datetimes; both ends are UTC.
    if start.tzinfo is None or end.tzinfo is None:
        start, end = start.replace(tzinfo=None), end.replace(tzinfo=None)
    return round((end - start).total_seconds(), 6)
