"""A fresh worker's first heartbeat: once Celery consumes its queues, or at once when its broker
does not answer (workers/__main__.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def test_steps_once_consuming_run_in_order_when_celery_is_ready_and_a_failing_one_stops_none():
    from celery.signals import worker_ready

    from workers.__main__ import once_consuming

    ran: list[str] = []

    def fails() -> None:
        ran.append("beat")
        raise ConnectionError("the database is away")

    once_consuming(fails, lambda: ran.append("warm-up"))
    assert ran == []  # nothing before Celery says it is ready
    worker_ready.send(sender=None)
    assert ran == ["beat", "warm-up"]


@pytest.fixture
def worker_rows(services_env):
    """`worker_rows(pid)`: the heartbeat rows of the worker process `pid` (named
    `host:<pid>:...`); the rows left are deleted after the test."""
    from sqlalchemy import delete, select

    from app.db import session_scope
    from app.models import Worker

    pids: list[int] = []

    def rows(pid: int) -> list[Worker]:
        pids.append(pid)
        with session_scope() as session:
            return list(session.scalars(select(Worker).where(Worker.name.like(f"%:{pid}:%"))))

    yield rows
    with session_scope() as session:
        for pid in set(pids):
            session.execute(delete(Worker).where(Worker.name.like(f"%:{pid}:%")))
        session.commit()


def test_a_worker_whose_broker_does_not_answer_at_start_is_listed_at_once_but_not_online(
    services_env, worker_rows, tmp_path
):
    """Celery never gets ready without its broker: the first beat does not wait for it, so the
    operator sees the worker and that its broker is not connected, rather than no worker."""
    env = {**os.environ, **services_env, "TRAINHUB_BROKER_URL": "redis://127.0.0.1:1/0"}  # nothing listens there
    log = tmp_path / "worker.log"
    with open(log, "wb") as output:
        worker = subprocess.Popen([sys.executable, "-m", "workers", "--hardware", "cpu", "--frameworks", "jax"],
                                  env=env, stdout=output, stderr=subprocess.STDOUT, cwd=Path(__file__).parents[2])
    try:
        deadline = time.monotonic() + 90
        while not (rows := worker_rows(worker.pid)) and time.monotonic() < deadline:
            assert worker.poll() is None, log.read_text()
            time.sleep(0.2)
        assert rows, f"no heartbeat row for the worker; its log:\n{log.read_text()}"
        assert rows[0].broker_ok is False and rows[0].queues == ["cpu.jax"]
    finally:
        worker.kill()
        worker.wait(30)


def test_a_heartbeat_says_not_online_until_celery_consumes_then_beats_at_once(services_env, worker_rows):
    from workers.hardware import Capabilities
    from workers.identity import Heartbeat, register

    identity = register(Capabilities(hardware="cpu", queues=["cpu.jax"], devices=["cpu:0"], versions={}, refused={}))
    ticks: list[int] = []
    heartbeat = Heartbeat(identity, 3600, lambda: ticks.append(1), consuming=False)
    try:
        pid = os.getpid()
        [starting] = [row for row in worker_rows(pid) if row.name == identity.name]
        assert starting.broker_ok is False  # listed, not online: Celery does not consume yet
        heartbeat.consuming()
        deadline = time.monotonic() + 30
        while not (ready := [r for r in worker_rows(pid) if r.name == identity.name and r.broker_ok]):
            assert time.monotonic() < deadline, "no beat after consuming()"
            time.sleep(0.05)
        assert ready[0].last_seen > starting.last_seen
        assert ticks == []  # the reconciler waits for a beat on time, not this one
    finally:
        heartbeat.stop()
    assert not [row for row in worker_rows(os.getpid()) if row.name == identity.name]  # stopping deletes it
