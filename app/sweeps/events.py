"""A sweep's server-sent events, derived from its trials' job rows and metrics rows:

    trial_start  {"trial", "params", "jobs"}               a trial's job(s) began to run
    trial_epoch  {"trial", "epoch", "objective"}           a trial ran an epoch (both jobs, in both frameworks)
    trial_end    {"trial", "status", "objective", "pruned_at_epoch"}
    sweep        {"status", "trials", "best", "budget"}    the sweep's counts changed; the last one ends the stream

A connection first gets the sweep's whole story so far, trial by trial, then what happens next
in the order it is seen. The events carry no ids: a client that reconnects gets the story again
from the stored rows, so it misses nothing (a job's own stream, /jobs/{id}/events, replays from a
Last-Event-ID).
"""

from __future__ import annotations

import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from starlette.concurrency import run_in_threadpool

from app import notify
from app.db import session_scope
from app.events import KEEPALIVE_S, KEY_CHECK_S, RETRY_MS, Event, key_is_live, poll_slot
from app.models import Sweep
from app.status import ACTIVE, JobStatus, SweepStatus
from app.sweeps import service
from app.sweeps.spec import Sweep as SweepOut
from app.sweeps.spec import SweepSpec

# Without the hub (app/notify.py), how often a stream looks at the database (seconds).
POLL_S = 1.0


@dataclass(frozen=True)
class TrialView:
    """What a trial's events are made of: its status, and its objective at each epoch run by
    every one of its jobs."""

    number: int
    status: str
    params: dict
    jobs: dict[str, str]
    objectives: tuple[float | None, ...]
    final_objective: float | None
    pruned_at_epoch: int | None


def look(sweep_id: str) -> tuple[SweepOut, list[TrialView]] | None:
    """The sweep's answer and its trials' views, in a session of its own; None if it is gone."""
    with session_scope() as session:
        sweep = session.get(Sweep, sweep_id)
        if sweep is None:
            return None
        spec = SweepSpec.model_validate(sweep.spec)
        found = service.trial_jobs(session, sweep_id)
        views = []
        listed = service.trials(session, spec, found)
        for trial in listed:
            group = found[trial.number]
            ran = min(job.epoch for job in group)
            per_epoch = []
            for epoch in range(1, ran + 1):
                values = [service.job_objective(spec, job, epoch) for job in group]
                per_epoch.append(None if None in values else sum(values) / len(values))  # type: ignore[arg-type]
            views.append(
                TrialView(
                    trial.number,
                    trial.status,
                    trial.params,
                    trial.jobs,
                    tuple(per_epoch),
                    trial.objective,
                    trial.pruned_at_epoch,
                )
            )
        return service.render(session, sweep, found, listed), views


def changes(before: dict[int, TrialView], now: list[TrialView]) -> list[Event]:
    """The events that take the trials from `before` to `now` (everything, from nothing)."""
    events = []
    for view in now:
        seen = before.get(view.number)
        started = view.status != JobStatus.QUEUED
        if started and (seen is None or seen.status == JobStatus.QUEUED):
            events.append(Event(None, "trial_start", {"trial": view.number, "params": view.params, "jobs": view.jobs}))
        done = len(seen.objectives) if seen else 0
        for epoch, value in enumerate(view.objectives[done:], start=done + 1):
            events.append(Event(None, "trial_epoch", {"trial": view.number, "epoch": epoch, "objective": value}))
        if view.status not in ACTIVE and (seen is None or seen.status in ACTIVE):
            events.append(
                Event(
                    None,
                    "trial_end",
                    {
                        "trial": view.number,
                        "status": view.status,
                        "objective": view.final_objective,
                        "pruned_at_epoch": view.pruned_at_epoch,
                    },
                )
            )
    return events


def _summary(sweep: SweepOut) -> dict:
    return sweep.model_dump(mode="json", include={"id", "status", "trials", "best", "budget"})


async def stream(sweep_id: str, key_id: str) -> AsyncGenerator[str, None]:
    """The encoded event stream of a sweep; it ends after the sweep's final `sweep` event, when
    the sweep is deleted, or when key `key_id` is revoked. Like a job's stream (app/events.py) it
    looks at the rows when the hub says a trial or the sweep changed, and polls every POLL_S
    (its key every KEY_CHECK_S) while the hub is not live."""
    yield f"retry: {RETRY_MS}\n\n"
    hub = notify.hub()
    with hub.watch(key_id, sweep_id=sweep_id) as watch:
        trials: dict[int, TrialView] = {}
        summary: dict | None = None
        last_write, next_key_check = time.monotonic(), time.monotonic() + KEY_CHECK_S
        while True:
            changed, _, key_changed = watch.take()
            live, now = hub.live, time.monotonic()
            if key_changed or (not live and now >= next_key_check):
                next_key_check = now + KEY_CHECK_S
                if not await run_in_threadpool(key_is_live, key_id):
                    return
            if changed or not live:
                async with poll_slot():
                    watch.reading, watch.read_unheard = True, watch.read_unheard or not hub.live
                    seen = await run_in_threadpool(look, sweep_id)
                    watch.reading = False
                if seen is None:
                    return
                sweep, views = seen
                for event in changes(trials, views):
                    yield event.encode()
                    last_write = time.monotonic()
                trials = {view.number: view for view in views}
                if _summary(sweep) != summary:
                    summary = _summary(sweep)
                    yield Event(None, "sweep", summary).encode()
                    last_write = time.monotonic()
                if sweep.status != SweepStatus.RUNNING and not any(v.status in ACTIVE for v in views):
                    return
            if time.monotonic() - last_write >= KEEPALIVE_S:
                last_write = time.monotonic()
                yield ": keepalive\n\n"
            await watch.wait(KEEPALIVE_S - (time.monotonic() - last_write) if live else POLL_S)
