"""Who this worker is and what it serves; its heartbeat row in the database."""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import delete
from sqlalchemy.dialects import postgresql, sqlite

from app.config import get_settings
from app.db import get_engine, session_scope
from app.models import Worker, utcnow
from trainers.data import installed_built_ins
from workers.hardware import Capabilities

log = logging.getLogger(__name__)


@dataclass
class WorkerIdentity:
    """This worker process: `name` is `hostname:pid:instance`, unique per process start (a
    restarted container's PID 1 gets a new instance), so a job its predecessor held is seen lost."""

    name: str
    hostname: str
    caps: Capabilities
    current_job_id: str | None = None

    def job_info(self) -> dict:
        """What a job records about the worker that ran it."""
        return {
            "name": self.name,
            "hostname": self.hostname,
            "pid": os.getpid(),
            "hardware": self.caps.hardware,
            "devices": self.caps.devices,
            "versions": self.caps.versions,
        }


_current: WorkerIdentity | None = None


def register(caps: Capabilities) -> WorkerIdentity:
    global _current
    hostname = socket.gethostname()
    instance = uuid.uuid4().hex[:8]
    _current = WorkerIdentity(name=f"{hostname}:{os.getpid()}:{instance}", hostname=hostname, caps=caps)
    return _current


def current_worker() -> WorkerIdentity:
    if _current is None:  # started by plain `celery worker`, not `python -m workers`
        raise RuntimeError("start workers with `trainhub worker` so they are pinned and registered")
    return _current


def beat(identity: WorkerIdentity, consuming: bool = True) -> None:
    """Upsert this worker's heartbeat row, saying whether the broker answers (broker_ok); not
    `consuming` (Celery not ready yet), broker_ok is false: listed, not online.

    `last_seen` is read before `current_job_id`: a beat stamped after a job's claim (started_at,
    from the same clock) names that job, so the reconciler may trust a beat that names another."""
    last_seen = utcnow()
    values = {
        "name": identity.name,
        "hostname": identity.hostname,
        "hardware": identity.caps.hardware,
        "queues": identity.caps.queues,
        "devices": identity.caps.devices,
        "versions": identity.caps.versions,
        "current_job_id": identity.current_job_id,
        "last_seen": last_seen,
        "broker_ok": consuming and broker_reachable(),
        "datasets": installed_built_ins(get_settings().data_dir),
    }
    dialect = postgresql if get_engine().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(Worker).values(**values, started_at=utcnow())
    statement = statement.on_conflict_do_update(
        index_elements=["name"], set_={k: v for k, v in values.items() if k != "name"}
    )
    with session_scope() as session:
        session.execute(statement)
        session.commit()


def broker_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the broker answers now (Redis: a PING; the embedded filesystem broker: its folder)."""
    url = get_settings().resolved_broker_url()
    if not url.startswith(("redis://", "rediss://")):
        return True
    import redis

    try:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            return bool(client.ping())
        finally:
            client.close()
    except redis.RedisError:
        return False


class Heartbeat:
    """Beats now (unless not `beat_now`), then every `interval_s` seconds in a daemon thread, each
    beat followed by `tick` (the reconciler). It beats while a job trains: that is how others know
    this worker lives. Made not `consuming`, its beats say broker_ok false (listed, not online)
    until `consuming()` is called, which beats at once. `stop()` ends it and deletes the row: a
    worker that stopped cleanly is gone at once, rather than online for another
    worker_timeout_s (a crashed one keeps its row, and that timeout)."""

    def __init__(
        self,
        identity: WorkerIdentity,
        interval_s: float,
        tick: Callable[[], None],
        beat_now: bool = True,
        consuming: bool = True,
    ) -> None:
        self.identity = identity
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._consuming = consuming
        if beat_now:
            beat(identity, self._consuming)

        def loop() -> None:
            while True:
                woken = self._wake.wait(interval_s)
                if self._stop.is_set():
                    return
                self._wake.clear()
                try:
                    beat(identity, self._consuming)
                    if not woken:  # (the reconciler's first run waits for a beat on time)
                        tick()
                except Exception as exc:  # the database or broker may be away for a while; keep trying
                    log.warning("heartbeat: %s: %s", type(exc).__name__, exc)

        self._thread = threading.Thread(target=loop, name="trainhub-heartbeat", daemon=True)
        self._thread.start()

    def consuming(self) -> None:
        """Celery consumes the worker's queues now: beat at once, from the heartbeat's thread (the
        caller, Celery's, does not wait for the database), and online from this beat on."""
        self._consuming = True
        self._wake.set()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)  # a beat or reconcile under way finishes first
        try:
            with session_scope() as session:
                session.execute(delete(Worker).where(Worker.name == self.identity.name))
                session.commit()
        except Exception as exc:  # the database is away: the row times out instead
            log.warning("could not delete worker %s's heartbeat: %s: %s", self.identity.name, type(exc).__name__, exc)
