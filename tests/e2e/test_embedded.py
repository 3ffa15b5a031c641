"""`trainhub up`: the embedded stack (SQLite, the filesystem broker, API and a cpu worker)."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from pathlib import Path

from app.client import TrainhubClient
from app.demo import start_up
from tests.e2e.conftest import wait_for


def child_pid(parent: int, module: str) -> int | None:
    """The pid of `parent`'s child running `python -m <module>`, or None."""
    children = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    for pid in children:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if module.encode() in argv:
            return int(pid)
    return None


def test_up_runs_jobs_of_both_frameworks_and_stops_cleanly(tmp_path, monkeypatch):
    var_dir = tmp_path / "var"
    # `up` is self-contained even when the environment names outside services.
    monkeypatch.setenv("TRAINHUB_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    process, url, key = start_up(var_dir)
    try:
        with TrainhubClient(url, key) as client:
            jobs = [client.submit({"framework": fw, "dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64})
                    for fw in ("jax", "pytorch")]
            jobs = [client.wait(job["id"], timeout_s=180) for job in jobs]
            for job in jobs:
                assert job["status"] == "succeeded", job["error"]
                assert len(job["metrics"]) == 2
                weights = client.download(job["id"], "weights.safetensors", tmp_path / job["id"])
                listed = {a["name"]: a for a in job["artifacts"]}["weights.safetensors"]
                assert hashlib.sha256(weights.read_bytes()).hexdigest() == listed["sha256"]

            # A worker that dies (killed, out of memory) is restarted; the stack goes on.
            worker_pid = child_pid(process.pid, "workers")
            os.kill(worker_pid, signal.SIGKILL)
            wait_for(lambda: child_pid(process.pid, "workers") not in (None, worker_pid), 30, "a new worker")
            assert process.poll() is None
            after = client.wait(client.submit({"framework": "pytorch", "dataset": {"name": "digits"}, "epochs": 1,
                                               "batch_size": 64})["id"], timeout_s=180)
            assert after["status"] == "succeeded", after["error"]
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
    assert (var_dir / "trainhub.db").is_file()
    assert any((var_dir / "artifacts").iterdir())
    assert (var_dir / "logs" / "worker-0.log").is_file()
    # `keys create --var-dir` from another folder makes a key the running stack's database holds.
    other = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHUB_")}
    for args in (["keys", "--var-dir", str(var_dir), "create", "--name", "x"],
                 ["keys", "create", "--name", "y", "--var-dir", str(var_dir)]):
        made = subprocess.run([sys.executable, "-m", "app.cli", *args], env=other, cwd=tmp_path, capture_output=True,
                              text=True)
        assert made.returncode == 0, made.stderr


def test_keys_create_prints_the_secret_on_the_last_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHUB_")}
    env["TRAINHUB_VAR_DIR"] = str(tmp_path)
    # From a folder with no stack, a new empty database is made only when asked (--init): a key in
    # it would be refused by the running stack, which keeps its database elsewhere.
    refused = subprocess.run([sys.executable, "-m", "app.cli", "keys", "create", "--name", "ci"],
                             env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and "--var-dir" in refused.stderr and "--init" in refused.stderr
    assert not (tmp_path / "trainhub.db").exists()
    out = subprocess.run([sys.executable, "-m", "app.cli", "keys", "create", "--name", "ci", "--init"],
                         env=env, capture_output=True, text=True, check=True).stdout
    secret = out.strip().splitlines()[-1]
    assert secret.startswith("th_") and len(secret) > 30
    # only its hash is stored
    assert secret.encode() not in (tmp_path / "trainhub.db").read_bytes()
