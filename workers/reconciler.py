"""Keep the broker in step with the database, the source of truth. Run by every worker's
heartbeat thread; every step is a compare-and-set, so workers running it at once are harmless.

1. Jobs whose worker was lost: a `running` job whose worker has not beaten its heartbeat for
   `worker_timeout_s` goes back to `queued` (and resumes from its checkpoint on its next
   attempt), or ends `failed` with error.type "worker_lost" after `max_attempts` attempts.
2. Jobs without a message: `queued` jobs never handed to the broker (it was down at submit).
3. A broker that lost its messages: Redis restarted without persistence forgets its queues. A
   marker key that only the reconciler writes tells: when it is gone, every queued job is sent
   again. A duplicate message is harmless: the claim is a compare-and-set on the row.
"""

from __future__ import annotations

import logging
from datetime import timedelta

import redis
from sqlalchemy import select, update

from app import jobs
from app.config import get_settings
from app.db import session_scope
from app.models import Job, Worker, aware, utcnow

log = logging.getLogger(__name__)

BROKER_MARKER = "trainhub:broker-marker"
# A queued job younger than this may still be on its way to the broker from the API.
UNSENT_GRACE_S = 2.0


def reconcile() -> None:
    requeue_lost_jobs()
    send_unsent_jobs()
    resend_if_broker_lost_messages()


def requeue_lost_jobs() -> None:
    settings = get_settings()
    since = utcnow() - timedelta(seconds=settings.worker_timeout_s)
    with session_scope() as session:
        alive = set(session.scalars(select(Worker.name).where(Worker.last_seen >= since)))
        running = session.scalars(select(Job).where(Job.status == "running")).all()
        # A claim younger than the timeout is not judged: its worker may be one that just woke up
        # (a stopped process, a paused VM) and has not beaten its heartbeat yet.
        lost = [job for job in running
                if (job.worker or {}).get("name") not in alive
                and (job.started_at is None or aware(job.started_at) < since)]
        for job in lost:
            # Fenced by the attempt we saw: a worker that claims it meanwhile wins.
            fence = (Job.id == job.id, Job.status == "running", Job.attempts == job.attempts)
            if job.cancel_requested:
                session.execute(update(Job).where(*fence).values(status="cancelled", finished_at=utcnow()))
            elif job.attempts >= settings.max_attempts:
                session.execute(update(Job).where(*fence).values(
                    status="failed", finished_at=utcnow(),
                    error={"type": "worker_lost", "message": f"the worker was lost {job.attempts} times "
                           f"(max_attempts={settings.max_attempts}); last on {(job.worker or {}).get('name')}"}))
                log.warning("job %s failed: worker lost %d times", job.id, job.attempts)
            else:
                session.execute(update(Job).where(*fence).values(status="queued", enqueued_at=None))
                log.warning("job %s: worker %s lost; queued again", job.id, (job.worker or {}).get("name"))
        session.commit()


def send_unsent_jobs() -> None:
    grace = utcnow() - timedelta(seconds=UNSENT_GRACE_S)
    with session_scope() as session:
        unsent = session.scalars(
            select(Job).where(Job.status == "queued", Job.enqueued_at.is_(None), Job.created_at < grace)
        ).all()
        for job in unsent:
            jobs.enqueue(session, job)


def resend_if_broker_lost_messages() -> None:
    url = get_settings().resolved_broker_url()
    if not url.startswith(("redis://", "rediss://")):
        return  # the embedded filesystem broker keeps its messages on disk
    client = redis.Redis.from_url(url, socket_timeout=2)
    # SET NX: of the workers that notice at once, one resends.
    if not client.set(BROKER_MARKER, utcnow().isoformat(), nx=True):
        return
    with session_scope() as session:
        queued = session.scalars(select(Job).where(Job.status == "queued")).all()
        if queued:
            log.warning("the broker lost its messages (restarted?); sending %d queued job(s) again", len(queued))
        for job in queued:
            jobs.enqueue(session, job)

