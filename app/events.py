"""A job's server-sent events, derived from its row and its metrics rows (nothing extra is stored).

Every event with an `id` has a sequence number that orders the job's life:

    0             status "queued"                (the job was created)
    1             status "running"               (a worker claimed it)
    1 + k         metrics of epoch k, k = 1..epochs
    2 + epochs    the final status: succeeded | failed | cancelled, with `error` (type from
                  app/failures.py's closed list) and `retries`

The numbers are functions of what is stored, so a client that reconnects with
`Last-Event-ID: n` is sent exactly the events numbered above n and misses nothing. A fresh
connection replays the job's whole story. Events without an id are hints, not replayed after a
reconnect: "waiting" (why a queued job has not started, null once it has) and, for user code,
"log" ({"text": one or more whole lines its code printed}; a fresh connection sends those stored
so far first, a reconnection only those stored after it; logs.txt keeps them all).

A stream reads the database only when told its job, its queue or its key changed (app/notify.py:
one LISTEN connection per API process), each time in a new, short session, and holds none while
it waits: many idle watchers cost no query and share the connection pool with the rest of the API.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
import weakref
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from app import failures, jobs, notify, rendering
from app.db import session_scope
from app.models import ApiKey, EpochMetric, Job, JobLog, rfc3339
from app.queue import queue_name
from app.schemas import FINISHED
from app.status import JobStatus
from trainers.spec import MAX_EPOCHS

# Without the hub (SQLite, or its listener reconnecting), how often a stream looks at the
# database (seconds): an epoch appears at most this late.
POLL_S = 0.5
# How often at most a queued job's waiting reason is recomputed (two queries; heartbeats come
# every 5 s): without the hub, this often; with it, when a job of its queue or the fleet changed.
WAITING_CHECK_S = 2.0
# Without the hub, how often an open stream checks that its key is still live (seconds): a
# revoked key's streams end after this (with the hub, at once), while its new requests are 401.
KEY_CHECK_S = 5.0
# A comment line this often keeps proxies and clients from timing out an idle stream.
KEEPALIVE_S = 15.0
# Polls of all streams in flight at once, per event loop: they run in the thread pool and must
# leave it (and the connection pool) to the other requests however many watchers there are.
MAX_CONCURRENT_POLLS = 4
# Output rows a look sends at most (a stream behind on a chatty job catches up over a few looks).
MAX_LOG_ROWS = 100
# What a browser waits before reconnecting (milliseconds), sent as the stream's `retry:`.
RETRY_MS = 1000


@dataclass(frozen=True)
class Event:
    """One server-sent event: `id` is its sequence number (None for hints), `data` a JSON object."""

    id: int | None
    event: str  # "status" | "metrics" | "waiting" | "log"
    data: dict

    def encode(self) -> str:
        lines = [f"id: {self.id}"] if self.id is not None else []
        lines.append(f"event: {self.event}")
        lines.append(f"data: {json.dumps(_finite(self.data), allow_nan=False, separators=(',', ':'))}")
        return "\n".join(lines) + "\n\n"


@dataclass(frozen=True)
class JobState:
    """The columns of a job's row that its events are made of."""

    status: str
    framework: str
    hardware: str
    epochs: int
    epoch: int
    attempts: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    result: dict | None
    error: dict | None
    timings: dict | None
    worker: dict | None
    devices: int = 1
    retries: int = 0
    last_error: dict | None = None
    # Its place in its queue depends on whose it is and its level (app/scheduling.position).
    owner_id: str = ""
    priority: int = 1

    @property
    def queue(self) -> str:
        return queue_name(self.hardware, self.framework, self.devices or 1)


def final_id(epochs: int) -> int:
    """The sequence number of a job's final status event."""
    return epochs + 2


def parse_last_event_id(value: str | None) -> int:
    """The number a client last saw, within the numbers a job's events can have (-1 to the final
    status of a job of MAX_EPOCHS epochs): -1 (replay everything) when absent or not a number,
    and a larger number clamped, so nothing from a header reaches a query unchecked."""
    try:
        number = int(value) if value is not None and value.strip().lstrip("-").isdigit() else -1
    except ValueError:
        return -1
    return min(max(number, -1), final_id(MAX_EPOCHS))


def events_after(state: JobState, metrics: list[dict], last_id: int) -> list[Event]:
    """The job's events numbered above `last_id`, in order, from its row and the metrics rows
    read after it (`metrics`: dicts of app.rendering.metric, any epochs; those at or below
    `last_id` are skipped). The same stored rows always give the same events."""
    events = []
    if last_id < 0:
        events.append(
            Event(
                0,
                "status",
                {
                    "status": JobStatus.QUEUED.value,
                    "at": _iso(state.created_at),
                    "progress": {"epoch": 0, "epochs": state.epochs},
                },
            )
        )
    # A job a lost worker left goes back to queued with started_at kept: it did run, and its
    # later epochs follow this event; the "waiting" hint says it waits again.
    if last_id < 1 and state.started_at is not None:
        events.append(
            Event(
                1,
                "status",
                {
                    "status": JobStatus.RUNNING.value,
                    "at": _iso(state.started_at),
                    "progress": {"epoch": 0, "epochs": state.epochs},
                    "attempts": state.attempts,
                },
            )
        )
    for metric in sorted(metrics, key=lambda m: m["epoch"]):
        if 1 + metric["epoch"] > last_id:
            events.append(
                Event(
                    1 + metric["epoch"],
                    "metrics",
                    {**metric, "progress": {"epoch": metric["epoch"], "epochs": state.epochs}},
                )
            )
    if state.status in FINISHED and last_id < final_id(state.epochs):
        events.append(
            Event(
                final_id(state.epochs),
                "status",
                {
                    "status": state.status,
                    "at": _iso(state.finished_at),
                    "progress": {"epoch": state.epoch, "epochs": state.epochs},
                    "result": state.result,
                    "error": failures.normalise(state.error) if state.status == JobStatus.FAILED else state.error,
                    "retries": state.retries,
                    "timings": state.timings,
                },
            )
        )
    return events


def read_state(session: Session, job_id: str) -> JobState | None:
    """The job's row without its relationships (one query); None if it is gone."""
    row = session.execute(
        select(
            Job.status,
            Job.framework,
            Job.hardware,
            Job.epochs,
            Job.epoch,
            Job.attempts,
            Job.created_at,
            Job.started_at,
            Job.finished_at,
            Job.result,
            Job.error,
            Job.timings,
            Job.worker,
            Job.devices,
            Job.retries,
            Job.last_error,
            Job.owner_id,
            Job.priority,
        ).where(Job.id == job_id)
    ).first()
    return JobState(*row) if row is not None else None


def read_metrics(session: Session, job_id: str, after_epoch: int) -> list[dict]:
    """The job's metrics of the epochs after `after_epoch`."""
    rows = session.scalars(
        select(EpochMetric)
        .where(EpochMetric.job_id == job_id, EpochMetric.epoch > after_epoch)
        .order_by(EpochMetric.epoch)
    )
    return [rendering.metric(m) for m in rows]


def current_waiting_reason(session: Session, state: JobState) -> str | None:
    """Why the queued job waits (app.jobs.waiting_reason), computed without loading its relations."""
    probe = Job(
        owner_id=state.owner_id,
        priority=state.priority,
        status=state.status,
        hardware=state.hardware,
        framework=state.framework,
        devices=state.devices,
        created_at=state.created_at,
        retries=state.retries,
        last_error=state.last_error,
    )
    return jobs.waiting_reason(session, probe, jobs.online_queues(session))


def read_logs(session: Session, job_id: str, after: int) -> list[tuple[int, str]]:
    """(row id, text) of the job's stored output after row `after`, at most MAX_LOG_ROWS of them."""
    rows = session.execute(
        select(JobLog.id, JobLog.text).where(JobLog.job_id == job_id, JobLog.id > after).order_by(JobLog.id)
    )
    return [(row_id, text) for row_id, text in rows.fetchmany(MAX_LOG_ROWS)]


def last_log(job_id: str) -> int:
    """The id of the job's last stored output row (0: none): a reconnecting stream sends only later ones."""
    with session_scope() as session:
        return session.scalar(select(func.max(JobLog.id)).where(JobLog.job_id == job_id)) or 0


def poll(
    job_id: str, last_id: int, want_reason: bool, log_after: int | None = None
) -> tuple[JobState | None, list[dict], str | None, list[tuple[int, str]]]:
    """One look at the database in a session of its own: the row first, then the metrics and the
    output rows after `log_after` (None: a job without user code has none), so a finished row is
    never seen with metrics or output missing (a worker stores them before it ends the job)."""
    with session_scope() as session:
        state = read_state(session, job_id)
        if state is None:
            return None, [], None, []
        metrics = read_metrics(session, job_id, after_epoch=max(last_id - 1, 0)) if state.started_at else []
        reason = current_waiting_reason(session, state) if want_reason and state.status == JobStatus.QUEUED else None
        logs = read_logs(session, job_id, log_after) if log_after is not None and state.started_at else []
        return state, metrics, reason, logs


_poll_slots: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = weakref.WeakKeyDictionary()


def poll_slot() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _poll_slots:
        _poll_slots[loop] = asyncio.Semaphore(MAX_CONCURRENT_POLLS)
    return _poll_slots[loop]


async def stream(job_id: str, last_id: int, key_id: str) -> AsyncGenerator[str, None]:
    """The encoded event stream of a job after `last_id`; it ends after the final status, when
    the job is deleted, or when key `key_id` is revoked.

    It reads the database when the hub (app/notify.py) says the job, its queue or its key
    changed, and otherwise only sends a keepalive; while the hub is not live (SQLite, or the
    listener reconnecting) it polls every POLL_S, the waiting reason every WAITING_CHECK_S and
    the key every KEY_CHECK_S."""
    yield f"retry: {RETRY_MS}\n\n"
    hub = notify.hub()
    # Output rows already sent (user code only): none on a fresh connection, all stored on a reconnection.
    log_after: int | None = None
    if await run_in_threadpool(has_user_code, job_id):
        log_after = 0 if last_id < 0 else await run_in_threadpool(last_log, job_id)
    with hub.watch(key_id, job_id=job_id) as watch:
        reason: str | None = None
        next_reason_check, next_key_check = 0.0, time.monotonic() + KEY_CHECK_S
        last_write = time.monotonic()
        while True:
            job_changed, queue_changed, key_changed = watch.take()
            live, now = hub.live, time.monotonic()
            if key_changed or (not live and now >= next_key_check):
                next_key_check = now + KEY_CHECK_S
                if not await run_in_threadpool(key_is_live, key_id):
                    return
            want_reason = (job_changed or queue_changed) if live else now >= next_reason_check
            if want_reason and not job_changed and now < next_reason_check:
                # a busy queue: its waiters look again at most every WAITING_CHECK_S
                watch.defer_queue()
                want_reason = False
            if job_changed or want_reason or not live:
                async with poll_slot():
                    watch.reading, watch.read_unheard = True, watch.read_unheard or not hub.live
                    state, metrics, new_reason, logs = await run_in_threadpool(
                        poll, job_id, last_id, want_reason, log_after
                    )
                    watch.reading = False
                if state is None:
                    return
                for row_id, text in logs:
                    yield Event(None, "log", {"text": text}).encode()
                    log_after, last_write = row_id, time.monotonic()
                if len(logs) == MAX_LOG_ROWS:
                    watch.wake(job=True)  # more are stored: look again at once
                watch.queue, watch.waiting = state.queue, state.status == JobStatus.QUEUED
                watch.seen = (state.status, state.epoch, state.started_at is not None)
                if want_reason:
                    next_reason_check = time.monotonic() + WAITING_CHECK_S
                for event in events_after(state, metrics, last_id):
                    yield event.encode()
                    last_id, last_write = event.id if event.id is not None else last_id, time.monotonic()
                if state.status in FINISHED:
                    return
                if (want_reason and watch.waiting and new_reason != reason) or (
                    not watch.waiting and reason is not None
                ):
                    # the reason changed, or the job left the queue (null: it no longer waits)
                    reason, last_write = (new_reason if watch.waiting else None), time.monotonic()
                    yield Event(None, "waiting", {"waiting_reason": reason}).encode()
            if time.monotonic() - last_write >= KEEPALIVE_S:
                last_write = time.monotonic()
                yield ": keepalive\n\n"
            if live:
                until_keepalive = KEEPALIVE_S - (time.monotonic() - last_write)
                until_reason = next_reason_check - time.monotonic() if watch.queue_changed else until_keepalive
                await watch.wait(max(min(until_keepalive, until_reason), 0.0))
            else:
                await watch.wait(POLL_S)


def has_user_code(job_id: str) -> bool:
    """Whether the job trains user code (only those have output rows)."""
    with session_scope() as session:
        return session.scalar(select(Job.code_id).where(Job.id == job_id)) is not None


def key_is_live(key_id: str) -> bool:
    """Whether key `key_id` exists and is not revoked (its streams end when it is not)."""
    with session_scope() as session:
        key = session.get(ApiKey, key_id)
        return key is not None and key.revoked_at is None


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return rfc3339(value)


def _finite(value: Any) -> Any:
    # JSON has no NaN or Infinity (a diverged loss): send null, which every client can parse.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value
