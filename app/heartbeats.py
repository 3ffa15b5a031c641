"""The fleet as the database sees it: workers' heartbeat rows and the jobs queued per queue.

Workers write their heartbeat every few seconds (workers/identity.py); a worker is online while
its last one is younger than `Settings.worker_timeout_s`. Queue depths count queued job rows,
the source of truth, rather than broker messages (which may be duplicates or already skipped).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from app import tallies
from app.config import get_settings
from app.models import Worker, aware, utcnow
from trainers.spec import FRAMEWORKS, HARDWARE

KNOWN_QUEUES = tuple(f"{hardware}.{framework}" for hardware in HARDWARE for framework in FRAMEWORKS)
# Workers whose last heartbeat is older than this are left out of listings (a restarted worker
# gets a new name, so old rows pile up).
FORGET_AFTER = timedelta(hours=24)


def online_since() -> datetime:
    """Heartbeats at or after this time count as online."""
    return utcnow() - timedelta(seconds=get_settings().worker_timeout_s)


def is_online(worker: Worker, since: datetime) -> bool:
    """Whether the worker can take work: a recent heartbeat, and its broker reachable."""
    return aware(worker.last_seen) >= since and worker.broker_ok


def recent_workers(session: Session) -> list[Worker]:
    """Workers seen in the last FORGET_AFTER, most recently seen first."""
    query = select(Worker).where(Worker.last_seen >= utcnow() - FORGET_AFTER).order_by(Worker.last_seen.desc())
    return list(session.scalars(query))


def online_workers(session: Session) -> list[Worker]:
    return list(session.scalars(select(Worker).where(Worker.last_seen >= online_since(), Worker.broker_ok)))


def queue_depths(session: Session, owner_id: str | None = None) -> dict[str, int]:
    """Queued jobs per queue (`Job.queue`), every known one-device queue included (0 when empty);
    with `owner_id`, that key's only. Read from the tallies (app/tallies.py): a few rows."""
    return {**dict.fromkeys(KNOWN_QUEUES, 0), **tallies.queue_depths(session, owner_id)}


def workers_per_queue(workers: list[Worker]) -> dict[str, int]:
    """How many of `workers` serve each queue, every known queue included."""
    counts = dict.fromkeys(KNOWN_QUEUES, 0)
    for worker in workers:
        for queue in worker.queues:
            counts[queue] = counts.get(queue, 0) + 1
    return counts
