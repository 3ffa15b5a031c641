"""Stopping the API never waits on its clients: an open event stream or download ends, and the
server exits within 5 s of SIGTERM (issue 15, item 4)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from app.stack import free_port
from tests.e2e.conftest import wait_for

pytestmark = pytest.mark.e2e


def key(env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "app.cli", "keys", "create", "--name", "shutdown"], env=env,
                         capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


@pytest.mark.parametrize("api_processes", [1, 2])
def test_serve_exits_within_5_s_of_sigterm_with_an_event_stream_open(services_env, api_processes):
    env = {**os.environ, **services_env}
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "app.cli", "serve", "--port", str(port),
                               "--workers", str(api_processes)], env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _ready(url), 60, "the API")
        auth = {"Authorization": f"Bearer {key(env)}"}
        # A tpu job: no worker here serves it, so it stays queued and its stream stays open.
        job = httpx.post(f"{url}/jobs", json={"framework": "jax", "hardware": "tpu"}, headers=auth).json()
        streamed = []

        def watch() -> None:
            try:
                with httpx.stream("GET", f"{url}/jobs/{job['id']}/events", headers=auth, timeout=60) as response:
                    for line in response.iter_lines():
                        streamed.append(line)
            except httpx.HTTPError:
                streamed.append("closed")

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        wait_for(lambda: any(line.startswith("event: status") for line in streamed), 30, "the stream's first event")

        stopped_at = time.monotonic()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=10)
        assert time.monotonic() - stopped_at < 5
        watcher.join(5)
        assert not watcher.is_alive()  # the stream ended with the server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
