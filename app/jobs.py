"""Job queries behind the routers: create, find, page, cancel; queue positions and waiting reasons.

Rows become HTTP answers in app/rendering.py; their transitions live in app/lifecycle.py."""

from __future__ import annotations

import logging
import re
import time
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import bindparam, select
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, lazyload
from sqlalchemy.orm.attributes import set_committed_value

from app import lifecycle, limits, pages, queue, scheduling, storage
from app.config import get_settings
from app.keys import Caller
from app.models import Job, Worker, utcnow
from app.schemas import JobSpec
from app.status import JobStatus
from trainers.spec import PRIORITIES

log = logging.getLogger(__name__)


class IdempotencyConflict(Exception):
    """The Idempotency-Key was used before with another body."""


class CannotCancel(Exception):
    """The job has already finished."""


def create_job(session: Session, owner: Caller, spec: JobSpec, idempotency_key: str | None) -> tuple[Job, int | None]:
    """Store the job, then enqueue its id; returns the job and its queue_position when stored
    (None for a replay: count it). The row is committed first, so a broker error leaves a queued
    job (logged) rather than a lost one. Replays an earlier job for a reused key (a replay counts
    against no quota). Raises limits.QuotaExceeded when the key may not add a job now."""
    if idempotency_key and (earlier := replay(session, owner, spec, idempotency_key)):
        return earlier, None
    job = new_job(owner, spec, idempotency_key)
    # Counted before the insert, outside the key's lock: exact for one submission at a time; a
    # burst of concurrent ones may be told the same place (GET /jobs/{id} counts again, exactly).
    position = queue_position(session, job)
    session.add(job)
    try:
        session.flush()  # the INSERT comes before commit_within_quota's lock on the key
    except IntegrityError:
        # A concurrent request with the same Idempotency-Key stored its job first: replay that.
        session.rollback()
        if idempotency_key and (earlier := replay(session, owner, spec, idempotency_key)):
            return earlier, None
        raise
    limits.commit_within_quota(session, owner, 1)
    enqueue(session, job)
    return job, position


def replay(session: Session, owner: Caller, spec: JobSpec, idempotency_key: str) -> Job | None:
    """The job an earlier request with this key created, or None. Raises IdempotencyConflict
    when that request had another body."""
    earlier = session.scalars(
        select(Job).where(Job.owner_id == owner.id, Job.idempotency_key == idempotency_key)
    ).first()
    if earlier is not None and earlier.spec != spec.model_dump(mode="json"):
        raise IdempotencyConflict(idempotency_key)
    return earlier


def new_job(owner: Caller, spec: JobSpec, idempotency_key: str | None = None) -> Job:
    """A queued job row for `spec`, not yet added to a session."""
    return Job(
        owner_id=owner.id,
        status=JobStatus.QUEUED,
        framework=spec.framework,
        hardware=spec.hardware,
        devices=spec.devices,
        spec=spec.model_dump(mode="json"),
        epochs=spec.epochs,
        dataset_id=spec.dataset.id,
        code_id=spec.model.code,
        priority=PRIORITIES.index(spec.priority),
        idempotency_key=idempotency_key,
        created_at=utcnow(),
        # A new job has none yet: loaded as empty, so rendering it asks the database nothing.
        metrics=[],
        artifacts=[],
    )


def enqueue(session: Session, job: Job) -> bool:
    """Send a committed job's id to its queue and stamp `enqueued_at`. A broker error is logged
    and the job stays queued with no stamp; the workers' reconciler sends it later."""
    try:
        queue.enqueue(job.id, job.queue)
    except Exception:  # the row is the source of truth; the job waits for the broker
        log.exception("could not enqueue job %s; it stays queued", job.id)
        return False
    now = utcnow()
    try:
        lifecycle.stamp_enqueued(session, job.id, now)
    except SQLAlchemyError:  # e.g. no free connection: the id is sent all the same
        session.rollback()
        log.warning(
            "job %s was sent to %s but not stamped; the reconciler sends it again (harmless)",
            job.id,
            job.queue,
            exc_info=True,
        )
        return True
    set_committed_value(job, "enqueued_at", now)  # what the row now says, without another UPDATE
    return True


def is_id(value: str) -> bool:
    """Ids are UUIDs; anything else (a NUL, a path) cannot name a row and is not looked up."""
    return canonical_id(value) == value


def canonical_id(value: str) -> str | None:
    """`value` as ids are stored (a UUID's lower-case, hyphenated form) when it spells a UUID in
    any of the usual ways (upper case, without hyphens, in braces, urn:uuid:); else None."""
    if len(value) > 45:
        return None
    try:
        return str(uuid.UUID(value))
    except ValueError:
        return None


# One job's metrics and artifacts are read when used (rendering.job skips them for a job no worker
# has started), not with the row as for a page of jobs.
_ON_FIRST_USE = (lazyload(Job.metrics), lazyload(Job.artifacts))


def get_job(session: Session, owner: Caller, job_id: str) -> Job | None:
    """The owner's job, or None when it does not exist or belongs to someone else (an admin key
    gets any job). Callers answer None with 404, never 403: an id reveals nothing.

    `job_id` is the id in any case, with or without hyphens, or its first 8 or more characters
    (as the CLI and dashboard show them) when exactly one of the owner's jobs starts with them."""
    return find_owned(session, owner, Job, job_id, _ON_FIRST_USE)


ID_PREFIX = re.compile(r"[0-9a-f]{8}[0-9a-f-]{0,27}")


def not_found_message(kind: str, ident: str) -> str:
    """The 404 detail for `kind` (job, comparison) `ident`; an id too short to look up says why."""
    shown = ident[:60]
    if len(ident) < 8 and re.fullmatch(r"[0-9a-fA-F-]+", ident):
        listing = "trainhub comparisons" if kind == "comparison" else "trainhub list"
        return (
            f"{kind} {shown} not found: a short id needs at least its first 8 characters "
            f"(as `{listing}` shows them), or give the whole id"
        )
    return f"{kind} {shown} not found"


def find_owned(session: Session, owner: Caller, model: Any, ident: str, options: Sequence[Any] = ()) -> Any:
    """The row of `model` (Job, Comparison) that `ident` names and `owner` may see, or None.
    `ident` is its id in any UUID spelling, or the first 8 or more characters of one (any case)
    when exactly one of the owner's rows starts with them."""
    if (full_id := canonical_id(ident)) is not None:
        row = session.get(model, full_id, options=options)
        return row if row is not None and (row.owner_id == owner.id or owner.is_admin) else None
    prefix = ident.lower()
    if not ID_PREFIX.fullmatch(prefix):
        return None
    query = select(model).where(model.id.startswith(prefix, autoescape=True)).options(*options).limit(2)
    if not owner.is_admin:
        query = query.where(model.owner_id == owner.id)
    found = list(session.scalars(query))
    return found[0] if len(found) == 1 else None


def list_jobs(
    session: Session,
    owner: Caller,
    *,
    status: str | None,
    framework: str | None,
    hardware: str | None,
    limit: int,
    cursor: str | None,
) -> tuple[list[Job], str | None]:
    """The owner's jobs (every job for an admin key) newest first, and the cursor of the next
    page (None on the last).

    Raises ValueError for a cursor this API did not hand out."""
    query = select(Job) if owner.is_admin else select(Job).where(Job.owner_id == owner.id)
    if status:
        query = query.where(Job.status == status)
    if framework:
        query = query.where(Job.framework == framework)
    if hardware:
        query = query.where(Job.hardware == hardware)
    return pages.page(session, query, Job, limit, cursor)


def cancel_job(session: Session, job: Job) -> Job:
    """A queued job is cancelled at once (it will never run); a running one is flagged, and its
    worker stops it after the step it is on (it looks every second or so, however slow the
    steps: see the trainers' chunks). Cancelling a cancelled job returns it unchanged.
    Raises CannotCancel for a job that succeeded or failed."""
    lifecycle.cancel(session, job.id)
    session.refresh(job)
    if job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED):
        raise CannotCancel(job.status)
    if job.status == JobStatus.CANCELLED and job.started_at is not None:
        storage.drop_checkpoint(job.id)  # it ran before being handed back: its last checkpoint
    return job


# Workers that can take work: a recent heartbeat, and their broker reachable.
_QUEUES_SEEN_SINCE = select(Worker.queues).where(Worker.last_seen >= bindparam("since"), Worker.broker_ok)


# Every poll of a queued job asks which queues have a live worker; that changes at heartbeat
# pace (seconds), so each process reads it at most once per ONLINE_QUEUES_TTL_S per database.
ONLINE_QUEUES_TTL_S = 1.0
_online: dict[str, tuple[float, frozenset[str]]] = {}


def online_queues(session: Session) -> set[str]:
    """Queues served by a worker whose heartbeat is recent (at most ONLINE_QUEUES_TTL_S old)."""
    database = str(session.get_bind().engine.url)
    read_at, queues = _online.get(database, (float("-inf"), frozenset()))
    if time.monotonic() - read_at > ONLINE_QUEUES_TTL_S:
        since = utcnow() - timedelta(seconds=get_settings().worker_timeout_s)
        queues = frozenset(
            q for worker_queues in session.scalars(_QUEUES_SEEN_SINCE, {"since": since}) for q in worker_queues
        )
        _online[database] = (time.monotonic(), queues)
    return set(queues)


def forget_online_queues() -> None:
    """Drop the cached online_queues: the next call reads the heartbeats again."""
    _online.clear()


def waiting_reason(session: Session, job: Job, served: set[str], position: int | None = None) -> str | None:
    """Why a queued job has not started yet; None for a job that is not queued. `position`: its
    queue_position when the caller has it already (counted here otherwise)."""
    if job.status != JobStatus.QUEUED:
        return None
    if job.queue not in served:
        if job.devices > 1:
            why = (
                f"no online worker owns {job.devices} {job.hardware} devices for {job.framework} "
                f"(queue {job.queue}); start one with `{worker_command(job.hardware, job.devices)}`"
            )
        else:
            why = f"no online worker serves {job.queue}"
    else:
        ahead = (position or queue_position(session, job) or 1) - 1
        why = f"waiting for a free worker on {job.queue} ({ahead} job(s) ahead)"
    return f"{retrying_after(job)}{why}"


def retrying_after(job: Job) -> str:
    """What a waiting hint starts with for a job the retry policy sent back to its queue: which
    retry it waits for and after which failure ("" for one never retried)."""
    if not job.retries or not job.last_error:
        return ""
    kind = job.last_error.get("type", "internal")
    return f"retry {job.retries} after {kind} ({job.last_error.get('message', '')}): "


def worker_command(hardware: str, devices: int) -> str:
    """The command that starts a worker owning `devices` devices of `hardware`: on cpu each core
    is pinned (--devices) and counted as a device (--cpu-devices); gpu and tpu count the ones listed."""
    indices = ",".join(str(i) for i in range(devices))
    if hardware == "cpu":
        return f"trainhub worker --hardware cpu --devices {indices} --cpu-devices {devices}"
    return f"trainhub worker --hardware {hardware} --devices {indices}"


def queue_position(session: Session, job: Job) -> int | None:
    """1 for the queued job of its queue (`<hardware>.<framework>[.x<devices>]`) that runs next,
    2 for the one after...; None for a job that is not queued. Counted from the jobs table
    (everyone's), in the queue's fair order across keys (app/scheduling.py): the broker may hold
    duplicate or stale messages, the rows do not."""
    if job.status != JobStatus.QUEUED:
        return None
    return scheduling.position(session, job)


def queue_positions(session: Session, page: Sequence[Job]) -> dict[str, int]:
    """queue_position of each queued job of `page` (a job list), by id, read a queue and level at a
    time rather than a job at a time (scheduling.positions); jobs not queued are left out."""
    return scheduling.positions(session, [job for job in page if job.status == JobStatus.QUEUED])
