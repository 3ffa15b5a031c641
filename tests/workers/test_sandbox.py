"""A user-code job's processes are held in its pids cgroup (workers/cgroup.py): a fork bomb stops at
the limit and the job fails saying so, and nothing the job started outlives it, daemons included.

The jobs run through workers/runner.py (claim, the real sandbox's child process, record, end) on
the real PostgreSQL and Redis; the cgroup is the host's own. Each test is skipped where the host
has no writable pids hierarchy (then a child left as root has no process limit: README)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.conftest import reset_caches
from workers import cgroup

WORKER = {"name": "test:sandbox", "hostname": "test", "hardware": "cpu", "devices": ["cpu:0"], "versions": {}}

pytestmark = pytest.mark.skipif(
    cgroup.hierarchy() is None,
    reason="this host has no writable pids cgroup hierarchy (cgroup v1 pids mount, or cgroup2 with pids)",
)

# Each function forks, then builds a small torch model; each is guarded so that a broken
# containment ends by itself: a bounded number of forks, children that exit after a while.
CODE = textwrap.dedent('''
    import math
    import os
    import subprocess
    import time

    import torch
    from torch import nn


    def _net(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


    def build(input_shape, num_classes, marker=""):
        return _net(input_shape, num_classes)


    def fork_bomb(input_shape, num_classes, marker=""):
        forked, deadline = 0, time.monotonic() + 5
        while forked < 300 and time.monotonic() < deadline:
            if os.fork() == 0:
                time.sleep(30)
                os._exit(0)
            forked += 1
            print("forked", forked, flush=True)
        raise RuntimeError(f"not contained: {forked} children forked")


    def daemon(input_shape, num_classes, marker=""):
        # A daemon as programs start one: its own session, out of the child's process group (a
        # Python fork here could hang: torch's threads are running).
        pid = subprocess.Popen(["/bin/sleep", "120"], start_new_session=True).pid
        with open("daemon.pid", "w") as f:
            f.write(str(pid))
        os.kill(pid, 0)
        print("daemon", pid, "is running", flush=True)
        return _net(input_shape, num_classes)
''')


@pytest.fixture
def coder(services_env, monkeypatch):
    """Headers of a key that may use user code, on a deployment that allows it; no job is waiting."""
    from app.db import session_scope
    from app.keys import create_key

    monkeypatch.setenv("TRAINHUB_ALLOW_USER_CODE", "1")
    reset_caches()
    with session_scope() as session:
        session.execute(text("UPDATE jobs SET status = 'cancelled' WHERE status IN ('queued', 'running')"))
        session.commit()
        secret = create_key(session, "coder", allow_code=True)[1]
    return {"Authorization": f"Bearer {secret}"}


def leftovers(marker: str) -> list[int]:
    """Live processes whose command line holds `marker` (a job's kwargs are in its child's)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:  # it ended meanwhile
            pass
    return found


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, killed but not yet reaped by its parent, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def marker():
    """A string that only this test's jobs carry; whatever still carries it afterwards is killed."""
    value = f"marker-{uuid.uuid4().hex}"
    yield value
    for pid in leftovers(value):
        os.kill(pid, signal.SIGKILL)


def run_job(api, auth, entrypoint: str, marker: str) -> dict:
    """Upload CODE (once per test), submit a 1-epoch job of `entrypoint`, run it here, return it."""
    from workers import runner

    source = CODE + f"\n# {uuid.uuid4().hex}\n"
    code = api.post("/code", content=source.encode(), params={"filename": "jobs.py"},
                    headers={**auth, "Content-Type": "application/octet-stream"})
    assert code.status_code == 201, code.text
    model = {"code": code.json()["id"], "entrypoint": f"jobs:{entrypoint}", "kwargs": {"marker": marker}}
    spec = {"framework": "pytorch", "dataset": {"name": "digits"}, "epochs": 1, "batch_size": 64, "model": model}
    job = api.post("/jobs", json=spec, headers=auth)
    assert job.status_code == 201, job.text
    runner.run(job.json()["id"], WORKER, serves=["cpu.pytorch"])
    return api.get(f"/jobs/{job.json()['id']}", headers=auth).json()


def test_a_fork_bomb_stops_at_the_limit_fails_saying_so_and_leaves_nothing(api, coder, marker):
    from workers import user_code

    bombed = run_job(api, coder, "fork_bomb", marker)
    assert bombed["status"] == "failed" and bombed["error"]["type"] == "user_code_error", bombed["error"]
    limit = user_code.PROCESSES + user_code.PROCESSES_PER_CORE * len(os.sched_getaffinity(0))
    assert f"reached its limit of {limit} processes" in bombed["error"]["message"], bombed["error"]
    logs = api.get(f"/jobs/{bombed['id']}/artifacts/logs.txt", headers=coder).text
    forked = [int(n) for n in re.findall(r"^forked (\d+)$", logs, re.M)]
    # The child and its threads count too (and a fork of a process that ran torch has 2 threads).
    assert forked and max(forked) < limit, logs[-2000:]
    assert leftovers(marker) == []

    after = run_job(api, coder, "build", marker)  # the worker still serves
    assert after["status"] == "succeeded", after["error"]
    assert leftovers(marker) == []


def test_a_daemonized_grandchild_dies_with_its_job(api, coder, marker, services_env):
    done = run_job(api, coder, "daemon", marker)
    assert done["status"] == "succeeded", done["error"]
    logs = api.get(f"/jobs/{done['id']}/artifacts/logs.txt", headers=coder).text
    pid = int(re.search(r"daemon (\d+) is running", logs).group(1))
    assert not alive(pid) and leftovers(marker) == []
    # What it wrote beside its artifacts went with it.
    assert not (Path(services_env["TRAINHUB_ARTIFACT_DIR"]) / done["id"] / "daemon.pid").exists()


HELPER = textwrap.dedent('''
    import os, time
    if os.fork() == 0:  # a daemon, out of this session
        os.setsid()
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        os._exit(0)
    os.wait()
    forked = 0
    for _ in range(20):
        try:
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        except BlockingIOError:
            break
        forked += 1
    print(forked, flush=True)
    time.sleep(60)
''')


def test_the_cgroup_helper_limits_forks_then_kills_everything_and_removes_itself():
    group = cgroup.JobCgroup.create("test-helper", 8)
    assert group is not None and group.path.is_dir()
    assert (group.path / "pids.max").read_text().strip() == "8"
    process = subprocess.Popen([sys.executable, "-I", "-c", HELPER], preexec_fn=group.join,
                               stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "6"  # 8 = it, the daemon and 6 sleepers
        inside = group.pids()
        assert process.pid in inside and len(inside) == 8
        assert group.reached_limit()
        assert group.destroy() == 8  # its peak
        assert process.wait(timeout=10) == -signal.SIGKILL
        assert not group.path.exists()
        assert [pid for pid in inside if alive(pid)] == []
    finally:
        if group.path.exists():
            group.destroy()
        process.kill()
        process.wait()


def test_a_new_worker_removes_the_cgroups_a_killed_worker_left_but_not_a_live_workers():
    gone = subprocess.Popen(["/bin/true"])
    gone.wait()  # a worker SIGKILLed mid-job: its pid is free, its job's cgroup still there
    where = cgroup.hierarchy()
    assert where is not None
    left = where.path / f"{uuid.uuid4()}-{gone.pid}-0badc0de"
    left.mkdir()
    live = cgroup.JobCgroup.create(str(uuid.uuid4()), 8)  # this process's: a live worker's
    assert live is not None
    sleeper = subprocess.Popen(["/bin/sleep", "60"], preexec_fn=cgroup.JobCgroup(left, where.version, 8).join,
                               start_new_session=True)
    try:
        assert cgroup.remove_orphans() >= 1
        assert sleeper.wait(timeout=10) == -signal.SIGKILL
        assert not left.exists() and live.path.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()
        for path in (left, live.path):
            if path.exists():
                cgroup.JobCgroup(path, where.version, 8).destroy()
