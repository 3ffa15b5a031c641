"""One listener per API process wakes the event streams whose job, queue or key changed.

PostgreSQL triggers (migration 0021) NOTIFY at commit: `trainhub_jobs` with "<job id> <queue>
<sweep id>" when a job is written or its status, epoch or start changes ("<job id>" for a
metrics row), `trainhub_sweeps` with "<sweep id>" when a sweep's status changes, and
`trainhub_keys` with "<key id>" when a key is revoked or deleted. The hub holds one LISTEN
connection while any stream is open and wakes the streams concerned; an idle stream costs no
query. A woken stream reads the rows, which are the truth: a notification is only a hint, and
one sent twice or for nothing costs one read.

What the hub cannot hear, it makes up for:
- While its connection is down (SQLite has no NOTIFY; PostgreSQL restarting) `live` is False
  and streams poll as they did before (app/events.py). When it (re)connects, the streams whose
  job changed or whose key was revoked meanwhile are woken (two queries for all of them).
- Workers coming and going change why a queued job waits without any job row changing: while
  streams of queued jobs are open, the hub looks at which queues are served (one query per
  FLEET_CHECK_S, however many streams) and wakes them when that changes.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy.engine import make_url
from starlette.concurrency import run_in_threadpool

from app.config import get_settings

log = logging.getLogger(__name__)

JOBS_CHANNEL = "trainhub_jobs"
KEYS_CHANNEL = "trainhub_keys"
SWEEPS_CHANNEL = "trainhub_sweeps"
# How often the hub looks at which queues are served while queued jobs are watched (seconds):
# workers beat every 5 s and count as gone after 30 s without a beat, so this is soon enough.
FLEET_CHECK_S = 5.0
# Waits between attempts to (re)connect the listener (seconds): doubling up to the last.
RECONNECT_S = (0.5, 1.0, 2.0, 5.0)


@dataclass(eq=False)
class Watch:
    """What one stream waits on: a job (`job_id`) or a sweep's trials (`sweep_id`), and its key.
    `job`, `queue_changed`, `key`: what changed since the stream last looked (the first two at
    first: it has not looked yet; its key was just checked)."""

    key_id: str
    job_id: str | None = None
    sweep_id: str | None = None
    queue: str | None = None  # set by the stream once it knows the job's queue
    waiting: bool = False  # the job is queued: the fleet's changes concern it
    seen: tuple | None = None  # the job's (status, epoch, started) as the stream last read them
    reading: bool = False  # a read of the rows is in flight
    read_unheard: bool = False  # it read while the hub heard nothing: a change since may be unheard
    job: bool = True
    queue_changed: bool = True
    key: bool = False
    _woken: asyncio.Event = field(default_factory=asyncio.Event)

    def wake(self, job: bool = False, queue: bool = False, key: bool = False) -> None:
        self.job, self.queue_changed, self.key = self.job or job, self.queue_changed or queue, self.key or key
        self._woken.set()

    def defer_queue(self) -> None:
        """Keep the queue's change for a later look, without waking the stream now."""
        self.queue_changed = True

    def take(self) -> tuple[bool, bool, bool]:
        """(job, queue, key) changed since the last take; clears them."""
        changed = (self.job, self.queue_changed, self.key)
        self.job = self.queue_changed = self.key = False
        self._woken.clear()
        return changed

    async def wait(self, timeout: float) -> None:
        """Until something changed, or `timeout` seconds."""
        try:
            await asyncio.wait_for(self._woken.wait(), timeout)
        except TimeoutError:
            pass


class Hub:
    """The streams of one event loop and the LISTEN connection that wakes them. `dsn`: a
    libpq connection string; None (SQLite) for a hub that is never live."""

    def __init__(self, dsn: str | None, served_queues: Callable[[], set[str]]) -> None:
        self._dsn = dsn
        self._served_queues = served_queues
        self._watches: set[Watch] = set()
        self._listener: asyncio.Task | None = None
        self._fleet: asyncio.Task | None = None
        self.live = False

    @property
    def watching(self) -> int:
        """Streams open on this event loop now."""
        return len(self._watches)

    @contextmanager
    def watch(self, key_id: str, job_id: str | None = None, sweep_id: str | None = None) -> Iterator[Watch]:
        """A Watch on job `job_id` or on the trials of sweep `sweep_id` for the duration of the
        block (register before reading the rows, so no change between the read and the wait is
        missed)."""
        watch = Watch(key_id, job_id, sweep_id)
        self._watches.add(watch)
        self._start()
        try:
            yield watch
        finally:
            self._watches.discard(watch)
            if not self._watches:
                self._stop()

    def dispatch(self, channel: str, payload: str) -> None:
        """Wake the watches a notification concerns."""
        if channel == KEYS_CHANNEL:
            for watch in self._watches:
                if watch.key_id == payload:
                    watch.wake(key=True)
            return
        if channel == SWEEPS_CHANNEL:
            for watch in self._watches:
                if watch.sweep_id == payload:
                    watch.wake(job=True)
            return
        job_id, queue, sweep_id = (payload.split(" ") + ["", ""])[:3]
        for watch in self._watches:
            if watch.job_id == job_id or (sweep_id and watch.sweep_id == sweep_id):
                watch.wake(job=True)
            elif queue and watch.waiting and watch.queue == queue:
                watch.wake(queue=True)

    def wake_all(self) -> None:
        for watch in self._watches:
            watch.wake(job=True, queue=True, key=True)

    async def _resync(self) -> None:
        """Once the hub hears again, wake the streams that read while it did not and whose job
        changed since (or whose read is still in flight), and those whose key was revoked: two
        queries for all of them, not a read per stream (a sweep's stream looks again)."""
        watches = list(self._watches)
        job_ids = [w.job_id for w in watches if w.job_id is not None and w.read_unheard]
        rows, live_keys = await run_in_threadpool(_standing, job_ids, {w.key_id for w in watches})
        for watch in watches:
            if watch.key_id not in live_keys:
                watch.wake(key=True)
            if watch.read_unheard:
                if watch.sweep_id is not None or watch.reading or rows.get(str(watch.job_id)) != watch.seen:
                    watch.wake(job=True)
                watch.read_unheard = False

    def _start(self) -> None:
        if self._dsn is not None and self._listener is None:
            self._listener = asyncio.create_task(self._listen())
        if self._fleet is None:
            self._fleet = asyncio.create_task(self._watch_fleet())

    def _stop(self) -> None:
        for task in (self._listener, self._fleet):
            if task is not None:
                task.cancel()
        self._listener = self._fleet = None
        self.live = False

    async def _listen(self) -> None:
        import psycopg  # here: the embedded stack (SQLite) runs without it
        from psycopg.conninfo import make_conninfo

        assert self._dsn is not None  # started only with a dsn
        # TCP keepalives, so a peer gone silent is noticed without sending queries
        dsn = make_conninfo(self._dsn, keepalives=1, keepalives_idle=10, keepalives_interval=5, keepalives_count=3)
        attempt = 0
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
                    await conn.execute(f"LISTEN {JOBS_CHANNEL}")
                    await conn.execute(f"LISTEN {KEYS_CHANNEL}")
                    await conn.execute(f"LISTEN {SWEEPS_CHANNEL}")
                    self.live, attempt = True, 0
                    await self._resync()  # what changed before the LISTEN, or while it was down
                    async for note in conn.notifies():
                        self.dispatch(note.channel, note.payload)
            except psycopg.Error as error:
                log.warning("event listener: %s; streams poll until it reconnects", error)
            finally:
                if self.live:
                    self.live = False
                    self.wake_all()  # they poll from now on
            await asyncio.sleep(RECONNECT_S[min(attempt, len(RECONNECT_S) - 1)])
            attempt += 1

    async def _watch_fleet(self) -> None:
        served: set[str] | None = None
        while True:
            await asyncio.sleep(FLEET_CHECK_S)
            if not self.live or not any(watch.waiting for watch in self._watches):
                served = None
                continue
            now = await run_in_threadpool(self._served_queues)
            if served is not None and now != served:
                for watch in self._watches:
                    if watch.waiting:
                        watch.wake(queue=True)
            served = now


_hubs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub] = weakref.WeakKeyDictionary()


def open_streams() -> int:
    """Event streams open in this process now, over every event loop."""
    return sum(h.watching for h in list(_hubs.values()))


def hub() -> Hub:
    """The hub of the running event loop (one per API process), made on first use."""
    loop = asyncio.get_running_loop()
    if loop not in _hubs:
        _hubs[loop] = Hub(listen_dsn(get_settings().resolved_database_url()), _served_queues)
    return _hubs[loop]


def listen_dsn(database_url: str) -> str | None:
    """The libpq form of a PostgreSQL SQLAlchemy URL; None for a database without NOTIFY."""
    url = make_url(database_url)
    if url.get_backend_name() != "postgresql":
        return None
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def _standing(job_ids: list[str], key_ids: set[str]) -> tuple[dict[str, tuple], set[str]]:
    """({job id: (status, epoch, started)} of the jobs still stored, the keys still live)."""
    from sqlalchemy import select

    from app.db import session_scope
    from app.models import ApiKey, Job

    with session_scope() as session:
        rows = session.execute(
            select(Job.id, Job.status, Job.epoch, Job.started_at.is_not(None)).where(Job.id.in_(job_ids))
        )
        jobs = {job_id: (status, epoch, started) for job_id, status, epoch, started in rows}
        keys = session.scalars(select(ApiKey.id).where(ApiKey.id.in_(key_ids), ApiKey.revoked_at.is_(None)))
        return jobs, set(keys)


def _served_queues() -> set[str]:
    from app import jobs
    from app.db import session_scope

    with session_scope() as session:
        return jobs.online_queues(session)
