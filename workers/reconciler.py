"""Keep the broker in step with the database, the source of truth. Run by every worker's
heartbeat thread; every change is a compare-and-set (app/lifecycle.py), so workers running it at
once are harmless.

1. Jobs whose worker was lost: a `running` job is lost when the worker instance that claimed it
   has not beaten its heartbeat for `worker_timeout_s`, or when that worker is alive but a
   heartbeat stamped after the claim names another job (or none): it moved on without ending
   this one (e.g. the database was away when it tried). A lost job goes back to `queued` (and
   resumes from its checkpoint), or ends `failed` with error.type "worker_lost" after
   `max_attempts` attempts, or `cancelled` when a cancel was asked.
2. Jobs without a message: `queued` jobs never handed to the broker (it was down at submit).
3. Messages the broker lost: Redis restarted from an older snapshot, a flushed database or a
   deleted list. A queued job whose message went out more than MESSAGE_GRACE_S ago but is in
   neither its queue nor the unacknowledged set (seen twice, a moment apart) is sent again. One
   worker at a time scans (a lock in Redis), and a resent job is stamped, so it is sent once.
   A duplicate message would still be harmless: the claim is a compare-and-set on the row.
"""

from __future__ import annotations

import logging
import re
import time
from datetime import datetime, timedelta

import redis
from sqlalchemy import select

from app import jobs, lifecycle
from app.config import get_settings
from app.db import session_scope
from app.lifecycle import JobStatus
from app.models import Job, Worker, aware, utcnow
from app.rendering import worker_alias

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


def requeue_lost_jobs() -> None:
    settings = get_settings()
    since = utcnow() - timedelta(seconds=settings.worker_timeout_s)
    with session_scope() as session:
        alive = {w.name: w for w in session.scalars(select(Worker).where(Worker.last_seen >= since))}
        running = session.scalars(select(Job).where(Job.status == JobStatus.RUNNING)).all()
        lost = [job for job in running if _is_lost(job, alive, since)]
        for job in lost:
            name = (job.worker or {}).get("name")
            if job.cancel_requested:
                lifecycle.cancel_lost(session, job.id, job.attempts)
            elif job.attempts >= settings.max_attempts:
                if lifecycle.fail_lost(
                    session,
                    job.id,
                    job.attempts,
                    f"the worker was lost {job.attempts} times (max_attempts={settings.max_attempts}); "
                    f"last on {worker_alias(str(name))}",  # the job's user sees no host or pid
                ):
                    log.warning("job %s failed: worker lost %d times", job.id, job.attempts)
            elif lifecycle.requeue_lost(session, job.id, job.attempts):
                log.warning("job %s: worker %s lost; queued again", job.id, name)


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
        queues = {Job(hardware=h, framework=f, devices=d).queue for _, h, f, d in queued}
        missing = {job_id for job_id, *_ in queued} - _ids_in_broker(client, queues)
        if missing:
            time.sleep(0.5)  # a message moving from its queue to `unacked` is in neither for a moment
            missing -= _ids_in_broker(client, queues)
        if missing:
            _resend(missing)
    finally:
        client.close()


def _ids_in_broker(client: redis.Redis, queues: set[str]) -> set[str]:
    """The job ids in `queues` (kombu's lists, priorities included) and in `unacked`."""
    found: set[bytes] = set()
    with client.pipeline(transaction=False) as pipe:
        for queue in queues:
            for name in (queue, *(f"{queue}\x06\x16{p}" for p in range(1, 10))):  # kombu's priority lists
                pipe.lrange(name, 0, -1)
        pipe.hvals(UNACKED)
        for messages in pipe.execute():
            for message in messages:
                found.update(_JOB_ID.findall(message))
    return {raw.decode() for raw in found}


def _resend(job_ids: set[str]) -> None:
    with session_scope() as session:
        for job in session.scalars(select(Job).where(Job.id.in_(job_ids), Job.status == JobStatus.QUEUED)):
            log.warning("job %s is queued but the broker lost its message; sending it again", job.id)
            jobs.enqueue(session, job)
