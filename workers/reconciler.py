"""Keep the broker in step with the database, the source of truth. Run by every worker's
heartbeat thread; every change is a compare-and-set (app/lifecycle.py), so workers running it at
once are harmless.

1. Jobs whose worker was lost: a `running` job is lost when the worker instance that claimed it
   has not beaten its heartbeat for `worker_timeout_s`, or when that worker is alive but a
   heartbeat stamped after the claim names another job (or none): it moved on without ending
   this one (e.g. the database was away when it tried). A lost job goes back to `queued` (and
   resumes from its checkpoint) while the retry policy's worker_lost retries last
   (Settings.retry_policy, 2 by default), then ends `failed` with error.type "worker_lost"; or
   `cancelled` when a cancel was asked.
2. Jobs without a message: `queued` jobs never handed to the broker (it was down at submit).
3. Messages the broker lost: Redis restarted from an older snapshot, a flushed database or a
   deleted list. A queued job whose message went out more than MESSAGE_GRACE_S ago but is in
   neither its queue nor the unacknowledged set (seen twice, a moment apart) is sent again,
   unless its queue holds a spare turn: a message is a turn in its queue (app/scheduling.py),
   and one whose job is no longer queued (it was taken out of turn, or cancelled) will claim a
   waiting job all the same. One worker at a time scans (a lock in Redis), and a resent job is
   stamped, so it is sent once. A duplicate message would still be harmless: the claim is a
   compare-and-set on the row.
4. Sweeps: every running sweep's turn is taken (app/sweeps/service.advance), which repairs what
   a crash between a trial's end and its sweep's turn left undone.
5. Retention: at most once per `retention_interval_s` across the fleet, one worker deletes the
   expired finished jobs with their files (app/retention.py), for a few seconds per heartbeat.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import time
from datetime import datetime, timedelta

import redis
from sqlalchemy import select

from app import jobs, lifecycle, retention, storage
from app.config import get_settings
from app.db import session_scope
from app.failures import Failure, FailureType
from app.lifecycle import JobStatus
from app.models import Job, Worker, aware, utcnow
from app.rendering import worker_alias
from app.sweeps import service as sweeps

log = logging.getLogger(__name__)

# A queued job younger than this may still be on its way to the broker from the API.
UNSENT_GRACE_S = 2.0
# A message sent this long ago must be in its queue or held unacknowledged by a worker.
MESSAGE_GRACE_S = 10.0
# Queued jobs looked for in the broker per scan (oldest message first); the rest wait a turn.
SCAN_LIMIT = 5000
SCAN_LOCK = "trainhub:broker-scan"
# kombu's Redis transport: messages a worker took but has not acknowledged (acks_late).
UNACKED = "unacked"
_JOB_ID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def reconcile() -> None:
    requeue_lost_jobs()
    send_unsent_jobs()
    resend_lost_messages()
    sweeps.advance_running()
    retention.delete_expired_if_due()


def requeue_lost_jobs() -> None:
    settings = get_settings()
    since = utcnow() - timedelta(seconds=settings.worker_timeout_s)
    with session_scope() as session:
        alive = {w.name: w for w in session.scalars(select(Worker).where(Worker.last_seen >= since))}
        running = session.scalars(select(Job).where(Job.status == JobStatus.RUNNING)).all()
        lost = [job for job in running if _is_lost(job, alive, since)]
        for job in lost:
            name = (job.worker or {}).get("name")
            where = worker_alias(str(name))  # the job's user sees no host or pid
            if job.cancel_requested:
                if lifecycle.cancel_lost(session, job.id, job.attempts):
                    storage.drop_checkpoint(job.id)
                continue
            allowed = settings.retries_for(FailureType.WORKER_LOST)
            lost_before = (job.retry_counts or {}).get(FailureType.WORKER_LOST.value, 0)
            error = Failure(
                FailureType.WORKER_LOST,
                f"the worker running the job, {where}, stopped beating its heartbeat",
            ).as_error()
            if lifecycle.retry(session, job.id, job.attempts, error, allowed):
                log.warning("job %s: worker %s lost; queued again", job.id, name)
            elif lifecycle.fail_lost(
                session,
                job.id,
                job.attempts,
                f"the worker running the job was lost {lost_before + 1} time(s), last {where}, and the retry "
                f"policy allows {allowed} retries (TRAINHUB_RETRY_POLICY worker_lost={allowed}); submit the job again",
            ):
                log.warning("job %s failed: worker lost %d times", job.id, lost_before + 1)
                storage.drop_checkpoint(job.id)


def _is_lost(job: Job, alive: dict[str, Worker], since: datetime) -> bool:
    # A job whose worker has no name looks up None and finds no worker; dict.get's stub wants a str.
    worker = alive.get((job.worker or {}).get("name"))  # type: ignore[arg-type]
    if worker is None:
        # A claim younger than the timeout is not judged: its worker may be one that just woke up
        # (a stopped process, a paused VM) and has not beaten its heartbeat yet.
        return job.started_at is None or aware(job.started_at) < since
    # Alive: lost only if a beat stamped after the claim (same clock) names another job.
    return (
        worker.current_job_id != job.id
        and job.started_at is not None
        and aware(worker.last_seen) > aware(job.started_at)
    )


def send_unsent_jobs() -> None:
    grace = utcnow() - timedelta(seconds=UNSENT_GRACE_S)
    with session_scope() as session:
        unsent = session.scalars(
            select(Job).where(Job.status == JobStatus.QUEUED, Job.enqueued_at.is_(None), Job.created_at < grace)
        ).all()
        for job in unsent:
            jobs.enqueue(session, job)


def resend_lost_messages() -> None:
    """Send again the queued jobs whose message the broker no longer holds (see the docstring)."""
    settings = get_settings()
    url = settings.resolved_broker_url()
    if not url.startswith(("redis://", "rediss://")):
        return  # the embedded filesystem broker keeps its messages on disk
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        # One scan per heartbeat interval across the fleet: the lock expires on its own.
        if not client.set(SCAN_LOCK, "1", nx=True, ex=max(1, round(settings.heartbeat_s))):
            return
        sent_before = utcnow() - timedelta(seconds=MESSAGE_GRACE_S)
        with session_scope() as session:
            queued = session.execute(
                select(Job.id, Job.hardware, Job.framework, Job.devices)
                .where(Job.status == JobStatus.QUEUED, Job.enqueued_at < sent_before)
                .order_by(Job.enqueued_at)
                .limit(SCAN_LIMIT)
            ).all()
        if not queued:
            return
        queue_of = {job_id: Job(hardware=h, framework=f, devices=d).queue for job_id, h, f, d in queued}
        queues = set(queue_of.values())
        missing = set(queue_of) - _ids_in_broker(client, queues)[0]
        if missing:
            time.sleep(0.5)  # a message moving from its queue to `unacked` is in neither for a moment
            found, waiting = _ids_in_broker(client, queues)
            missing -= found
        if missing:
            _resend(_beyond_spare_turns([job_id for job_id, *_ in queued if job_id in missing], queue_of, waiting))
    finally:
        client.close()


def _ids_in_broker(client: redis.Redis, queues: set[str]) -> tuple[set[str], dict[str, list[str]]]:
    """The job ids in `queues` (kombu's lists, priorities included) and in `unacked`; and the
    ids waiting in each queue's lists."""
    waiting: dict[str, list[str]] = {}
    found: set[str] = set()
    with client.pipeline(transaction=False) as pipe:
        names = [(queue, name) for queue in queues for name in (queue, *(f"{queue}\x06\x16{p}" for p in range(1, 10)))]
        for _, name in names:  # (kombu's priority lists)
            pipe.lrange(name, 0, -1)
        pipe.hvals(UNACKED)
        *lists, unacked = pipe.execute()
    for (queue, _), messages in zip(names, lists, strict=True):
        ids = [job_id for message in messages if (job_id := _job_id_of(message))]
        waiting.setdefault(queue, []).extend(ids)
        found.update(ids)
    found.update(raw.decode() for message in unacked for raw in _JOB_ID.findall(message))
    return found, waiting


def _job_id_of(message: bytes) -> str | None:
    """The job id a message of kombu's Redis transport carries (Celery's task protocol 2: the
    body is [args, kwargs, embed], args [job_id]); None for a message that is not one of ours.
    (The message's own ids, task and delivery tag, are UUIDs too: they must not be counted.)"""
    try:
        payload = json.loads(message)
        body = payload["body"]
        if payload.get("properties", {}).get("body_encoding") == "base64":
            body = base64.b64decode(body)
        job_id = json.loads(body)[0][0]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    return job_id if isinstance(job_id, str) and _JOB_ID.fullmatch(job_id.encode()) else None


def _beyond_spare_turns(missing: list[str], queue_of: dict[str, str], waiting: dict[str, list[str]]) -> list[str]:
    """The `missing` jobs (oldest first) that no spare turn of their queue covers: a spare turn
    is a message waiting in the queue whose job is no longer queued."""
    listed = {job_id for ids in waiting.values() for job_id in ids}
    with session_scope() as session:
        still_queued = set(
            session.scalars(select(Job.id).where(Job.id.in_(listed), Job.status == JobStatus.QUEUED)) if listed else ()
        )
    spare = {queue: sum(job_id not in still_queued for job_id in ids) for queue, ids in waiting.items()}
    uncovered = []
    for job_id in missing:
        queue = queue_of[job_id]
        if spare.get(queue, 0) > 0:
            spare[queue] -= 1
        else:
            uncovered.append(job_id)
    return uncovered


def _resend(job_ids: list[str]) -> None:
    with session_scope() as session:
        for job in session.scalars(select(Job).where(Job.id.in_(job_ids), Job.status == JobStatus.QUEUED)):
            log.warning("job %s is queued but the broker lost its message; sending it again", job.id)
            jobs.enqueue(session, job)
