"""Event streams pushed by PostgreSQL's NOTIFY (app/notify.py): an idle stream costs no query,
a stored epoch reaches its stream at once, a revoked key ends its streams, and a listener that
lost its connection reconnects and misses nothing.

Polling is slowed to a minute in these tests, so only a notification can deliver an event in time.
"""

from __future__ import annotations

import json
import queue
import threading
import time

import pytest
from sqlalchemy import event, text

DIGITS = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 3}
WAIT_S = 10.0


@pytest.fixture
def slow_polls(monkeypatch):
    from app import events
    from app.sweeps import events as sweep_events

    monkeypatch.setattr(events, "POLL_S", 60.0)
    monkeypatch.setattr(sweep_events, "POLL_S", 60.0)
    monkeypatch.setattr(events, "KEY_CHECK_S", 60.0)
    monkeypatch.setattr(events, "WAITING_CHECK_S", 0.05)


class Reader:
    """A job's event stream read in a thread: `next_event()` gives (event, data) as they come."""

    def __init__(self, api, job_id: str, headers: dict, path: str = "/jobs/{}/events") -> None:
        self.events: queue.Queue = queue.Queue()
        self.ended = threading.Event()
        self._thread = threading.Thread(target=self._read, args=(api, path.format(job_id), headers), daemon=True)
        self._thread.start()

    def _read(self, api, path, headers) -> None:
        current: dict = {}
        with api.stream("GET", path, headers=headers) as response:
            for line in response.iter_lines():
                if line == "" and "data" in current:
                    self.events.put((current["event"], json.loads(current["data"])))
                    current = {}
                elif line and not line.startswith(":"):
                    field, _, value = line.partition(": ")
                    current[field] = value
        self.ended.set()

    def next_event(self, kind: str) -> dict:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            try:
                got, data = self.events.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                break
            if got == kind:
                return data
        raise AssertionError(f"no {kind} event within {WAIT_S} s")


def hub_is_live() -> bool:
    from app import notify

    return any(hub.live for hub in list(notify._hubs.values()))


def wait_until(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline, f"{what} within {WAIT_S} s"
        time.sleep(0.02)


class QueryCounter:
    """Statements the API's engine sends to the database, counted."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_args) -> None:
        self.count += 1


@pytest.fixture
def quiet_api(services_env, monkeypatch):
    """The API without its webhook dispatcher, whose look at the outbox every second is the
    only other query an idle API process makes."""
    from fastapi.testclient import TestClient

    from app.main import create_app
    from tests.conftest import reset_caches

    monkeypatch.setenv("TRAINHUB_WEBHOOK_DISPATCH", "false")
    reset_caches()
    with TestClient(create_app()) as client:
        yield client


@pytest.fixture
def queries(quiet_api):
    from app.db import get_engine

    counter = QueryCounter()
    event.listen(get_engine(), "before_cursor_execute", counter)
    yield counter
    event.remove(get_engine(), "before_cursor_execute", counter)


def test_an_idle_stream_costs_no_query_and_an_epoch_reaches_it_at_once(quiet_api, auth, rows, slow_polls, queries):
    api = quiet_api
    job = api.post("/jobs", json=DIGITS, headers=auth).json()["id"]
    rows.start(job)
    reader = Reader(api, job, auth)
    assert reader.next_event("status")["status"] == "queued"
    wait_until(hub_is_live, "the listener is live")
    reader.next_event("status")  # running
    settled = -1
    while settled != queries.count:  # the hub's first wake reads the rows once more
        settled = queries.count
        time.sleep(0.3)

    before = queries.count
    time.sleep(1.5)
    assert queries.count == before, "an idle stream of a running job reads nothing"

    rows.epoch(job, 1, loss=0.7)
    assert reader.next_event("metrics")["train_loss"] == 0.7
    rows.finish(job, result={"test_accuracy": 0.9, "test_loss": 0.3})
    assert reader.next_event("status")["status"] == "succeeded"
    assert reader.ended.wait(WAIT_S)


def test_a_waiting_job_is_told_when_the_job_ahead_starts(api, auth, rows, slow_polls, monkeypatch):
    from app import jobs
    from app.db import session_scope

    with session_scope() as session:  # only this test's jobs wait (earlier tests may leave some)
        session.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status = 'queued'"))
        session.commit()

    # a worker serves cpu.jax, so both jobs wait for it, one behind the other
    monkeypatch.setattr(jobs, "online_queues", lambda _session: {"cpu.jax"})
    first = api.post("/jobs", json=DIGITS, headers=auth).json()["id"]
    second = api.post("/jobs", json=DIGITS, headers=auth).json()["id"]
    reader = Reader(api, second, auth)
    assert reader.next_event("waiting")["waiting_reason"].endswith("(1 job(s) ahead)")
    wait_until(hub_is_live, "the listener is live")

    rows.start(first)
    assert reader.next_event("waiting")["waiting_reason"].endswith("(0 job(s) ahead)")
    api.post(f"/jobs/{second}/cancel", headers=auth)
    assert reader.next_event("status")["status"] == "cancelled"
    assert reader.ended.wait(WAIT_S)


def test_a_revoked_key_ends_its_open_stream_at_once(api, make_key, slow_polls):
    from app.db import session_scope
    from app.keys import revoke_key

    secret = make_key("watcher")
    headers = {"Authorization": f"Bearer {secret}"}
    job = api.post("/jobs", json=DIGITS, headers=headers).json()["id"]
    reader = Reader(api, job, headers)
    reader.next_event("status")
    wait_until(hub_is_live, "the listener is live")
    with session_scope() as session:
        assert revoke_key(session, secret[:10]) is not None
    assert reader.ended.wait(WAIT_S), "the stream ends although polling would take a minute"


def test_a_listener_that_lost_its_connection_reconnects_and_misses_nothing(api, auth, rows, slow_polls):
    from app.db import session_scope

    job = api.post("/jobs", json=DIGITS, headers=auth).json()["id"]
    rows.start(job)
    reader = Reader(api, job, auth)
    wait_until(hub_is_live, "the listener is live")
    reader.next_event("status")  # queued
    with session_scope() as session:  # the database drops the listener's connection
        ended = session.execute(text(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE 'LISTEN trainhub_%'"
        )).scalars().all()
    assert ended and all(ended)
    rows.epoch(job, 1, loss=0.5)  # stored while the listener is away or reconnecting
    assert reader.next_event("metrics")["train_loss"] == 0.5
    wait_until(hub_is_live, "the listener is live again")
    rows.epoch(job, 2, loss=0.25)
    assert reader.next_event("metrics")["train_loss"] == 0.25
    api.post(f"/jobs/{job}/cancel", headers=auth)
    rows.finish(job, status="cancelled")
    assert reader.next_event("status")["status"] == "cancelled"
    assert reader.ended.wait(WAIT_S)


def test_a_sweeps_stream_hears_its_trials_and_its_end(api, auth, rows, slow_polls):
    space = {"optimizer.learning_rate": {"log_uniform": [1e-3, 1e-1]}}
    body = {"base": {**DIGITS, "epochs": 2}, "space": space, "max_trials": 2, "parallelism": 1}
    sweep = api.post("/sweeps", json=body, headers=auth).json()["id"]
    trial = api.get(f"/sweeps/{sweep}/trials", headers=auth).json()["items"][0]
    reader = Reader(api, sweep, auth, path="/sweeps/{}/events")
    assert reader.next_event("sweep")["status"] == "running"
    wait_until(hub_is_live, "the listener is live")

    rows.start(trial["job_id"])
    assert reader.next_event("trial_start")["trial"] == 0
    rows.epoch(trial["job_id"], 1, loss=0.5)
    assert reader.next_event("trial_epoch")["epoch"] == 1
    api.post(f"/sweeps/{sweep}/cancel", headers=auth)
    rows.finish(trial["job_id"], status="cancelled")
    while (data := reader.next_event("sweep"))["status"] == "running":
        pass
    assert data["status"] == "cancelled"
    assert reader.ended.wait(WAIT_S)


def test_a_waiting_jobs_stream_says_what_its_job_says_behind_another_keys_jobs(api, auth, make_key, slow_polls,
                                                                               monkeypatch):
    from app import jobs
    from app.db import session_scope

    with session_scope() as session:  # only this test's jobs wait
        session.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status = 'queued'"))
        session.commit()
    monkeypatch.setattr(jobs, "online_queues", lambda _session: {"cpu.jax"})
    other = {"Authorization": f"Bearer {make_key('other')}"}
    for _ in range(2):
        api.post("/jobs", json=DIGITS, headers=other)
    mine = api.post("/jobs", json={**DIGITS, "priority": "low"}, headers=auth).json()["id"]
    reader = Reader(api, mine, auth)
    said = reader.next_event("waiting")["waiting_reason"]
    assert said == api.get(f"/jobs/{mine}", headers=auth).json()["waiting_reason"]
    assert said.endswith("(2 job(s) ahead)")
    api.post(f"/jobs/{mine}/cancel", headers=auth)
    assert reader.next_event("status")["status"] == "cancelled"
    assert reader.ended.wait(WAIT_S)
