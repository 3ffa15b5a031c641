"""`trainhub up`'s supervision (app/stack.py): a child that dies is restarted after a backoff; one
that keeps failing at start stops the stack (issue 15, item 10)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from app import stack


def supervised(tmp_path, code: str) -> stack.Stack:
    child = stack.Child("worker-0", [sys.executable, "-c", code], {}, tmp_path / "worker-0.log")
    return stack.Stack(url="http://unused", processes=[child.start()], children=[child])


def test_a_child_that_dies_is_restarted_with_a_line_saying_so(tmp_path, monkeypatch):
    monkeypatch.setattr(stack, "RESTART_BACKOFF_S", 0.1)
    running = supervised(tmp_path, "import time; time.sleep(60)")
    first = running.processes[0]
    first.kill()
    first.wait()
    said: list[str] = []
    deadline = time.monotonic() + 10
    while running.processes[0] is first and time.monotonic() < deadline:
        running.supervise(say=said.append)
        time.sleep(0.05)
    assert running.processes[0] is not first and running.processes[0].poll() is None
    assert said[0].startswith("worker-0 exited with code -9; restarting it in")
    assert said[1].startswith("worker-0 restarted (pid ")
    running.stop()


def test_a_child_that_keeps_failing_at_start_stops_the_stack(tmp_path, monkeypatch):
    monkeypatch.setattr(stack, "RESTART_BACKOFF_S", 0.01)
    running = supervised(tmp_path, "import sys; sys.exit(3)")
    with pytest.raises(stack.ChildKeepsFailing, match="exited with code 3 3 times"):
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            running.supervise(say=lambda line: None)
            time.sleep(0.05)


def test_the_embedded_stack_imports_without_psycopg():
    # The embedded stack (SQLite, the local broker) is what `make gpu-check` runs on a machine
    # carrying only the packages it needs: the API and the worker must not need PostgreSQL's driver.
    code = (
        "import sys; sys.modules['psycopg'] = None\n"  # any import of it now raises ImportError
        "import app.main, app.cli, workers.tasks, workers.__main__"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr[-2000:]
