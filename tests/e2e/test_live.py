"""Watching jobs through the real service: the event stream, /metrics, /workers and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

from app.client import TrainhubClient
from app.stack import free_port
from tests.e2e.conftest import wait_for

DIGITS = {"dataset": {"name": "digits"}, "batch_size": 64}


def test_reconnecting_with_last_event_id_misses_nothing(service):
    with service.client() as client:
        job = client.submit({**DIGITS, "framework": "pytorch", "epochs": 6, "batch_size": 32})
        stream = client.events(job["id"])
        before = []
        for event in stream:
            before.append(event)
            if event.event == "metrics":
                break
        stream.close()  # the client goes away after the first epoch...
        assert before[-1].data["epoch"] == 1
        # ...while the job trains on
        wait_for(lambda: client.get(job["id"])["progress"]["epoch"] >= 3, 60, "epoch 3")
        after = list(client.events(job["id"], last_event_id=before[-1].id))
        full = list(client.events(job["id"]))  # the job has ended: a fresh stream replays it all
        final = client.get(job["id"])

    assert final["status"] == "succeeded", final["error"]
    seen = before + after
    assert [e.id for e in seen if e.id is not None] == [str(i) for i in range(0, 6 + 3)]

    def story(events):
        return [
            (e.id, e.event, e.data.get("status"), e.data.get("epoch"), e.data.get("train_loss"))
            for e in events
            if e.id is not None
        ]

    assert story(seen) == story(full)
    assert [e.data["status"] for e in seen if e.event == "status"] == ["queued", "running", "succeeded"]
    metrics = [{k: v for k, v in e.data.items() if k != "progress"} for e in seen if e.event == "metrics"]
    assert metrics == final["metrics"]
    assert any(e.event == "metrics" for e in after), "no epoch was missed while disconnected"
    assert seen[-1].data["result"] == final["result"]


def test_thirty_watchers_leave_the_api_answering(service):
    watchers = 30
    key = service.new_key("watchers")
    with service.client(key) as client:
        # no gpu worker: the job waits, so the streams stay open until it is cancelled
        job = client.submit({**DIGITS, "framework": "pytorch", "hardware": "gpu"})
    connected = threading.Semaphore(0)

    def watch() -> list:
        with TrainhubClient(service.url, key) as watcher:
            events = []
            for event in watcher.events(job["id"]):
                events.append(event)
                if len(events) == 1:
                    connected.release()
            return events

    with ThreadPoolExecutor(watchers) as pool:
        streams = [pool.submit(watch) for _ in range(watchers)]
        try:
            for _ in range(watchers):
                assert connected.acquire(timeout=60), "a watcher never got its first event"
            time.sleep(1.5)  # every stream has waited a while since
            api_answers_while_streams_wait(service, key, job["id"], watchers)
        finally:  # the cancel ends the streams, also after a failed check
            with service.client(key) as client:
                client.cancel(job["id"])
        results = [stream.result(timeout=30) for stream in streams]
    for events in results:
        assert [(e.id, e.event) for e in events] == [("0", "status"), (None, "waiting"), ("12", "status")]
        assert events[1].data == {"waiting_reason": "no online worker serves gpu.pytorch"}
        assert events[-1].is_final and events[-1].data["status"] == "cancelled"


def api_answers_while_streams_wait(service, key: str, job_id: str, watchers: int) -> None:
    with httpx.Client(base_url=service.url, headers={"Authorization": f"Bearer {key}"}) as http:
        for _ in range(5):
            started = time.monotonic()
            assert http.get("/healthz", timeout=5).status_code == 200
            assert time.monotonic() - started < 1.0
            started = time.monotonic()
            assert http.get(f"/jobs/{job_id}", timeout=5).status_code == 200
            assert time.monotonic() - started < 1.0
            time.sleep(0.2)
    # the streams hold no database connection while they wait (the API process says so)
    with service.client(service.new_key("watchers-admin", admin=True)) as admin:
        samples = scrape(admin)
    assert samples[("trainhub_api_event_streams", ())] == watchers
    in_use = samples[("trainhub_api_db_connections", (("state", "in_use"),))]
    assert in_use <= 1, f"{in_use} database connections in use with {watchers} streams waiting"


def scrape(client: TrainhubClient) -> dict:
    samples = {}
    for family in text_string_to_metric_families(client.metrics()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_move_when_jobs_run(service):
    with service.client() as client:
        before = scrape(client)
        job = client.wait(client.submit({**DIGITS, "framework": "jax", "epochs": 2})["id"], timeout_s=120)
        assert job["status"] == "succeeded", job["error"]
        after = scrape(client)
    succeeded = ("trainhub_jobs", (("status", "succeeded"),))
    assert after[succeeded] == before.get(succeeded, 0) + 1
    labels = (("framework", "jax"), ("hardware", "cpu"))
    epochs = ("trainhub_epoch_duration_seconds_count", labels)
    assert after[epochs] == before.get(epochs, 0) + 2
    jobs = ("trainhub_job_duration_seconds_count", labels + (("status", "succeeded"),))
    assert after[jobs] == before.get(jobs, 0) + 1
    assert after[("trainhub_workers_online", (("hardware", "cpu"),))] >= 1
    assert ("trainhub_queue_depth", (("queue", "cpu.jax"),)) in after


def test_workers_lists_the_running_worker(service):
    with service.client() as client:
        fleet = wait_for(
            lambda: (f := client.workers()) and any(w["online"] for w in f["workers"]) and f, 30, "an online worker"
        )
    worker = next(w for w in fleet["workers"] if w["online"])
    assert set(worker["queues"]) == {"cpu.jax", "cpu.pytorch"}
    assert worker["hardware"] == "cpu" and worker["devices"] and set(worker["versions"]) >= {"jax", "pytorch"}
    queues = {q["name"]: q for q in fleet["queues"]}
    assert queues["cpu.jax"]["workers_online"] >= 1


def cli(service, *args: str, key: str | None, url: str | None = None) -> subprocess.CompletedProcess:
    env = {**service.env, "TRAINHUB_API_URL": url or service.url, "TRAINHUB_API_KEY": key or ""}
    return subprocess.run(
        [sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True, timeout=240
    )


def test_cli_submit_wait_watch_and_download(service, tmp_path):
    key = service.new_key("cli")
    submitted = cli(
        service,
        "submit",
        "--framework",
        "pytorch",
        "--dataset",
        "digits",
        "--epochs",
        "3",
        "--batch-size",
        "64",
        "--wait",
        "--json",
        key=key,
    )
    assert submitted.returncode == 0, submitted.stderr
    job = json.loads(submitted.stdout)
    assert job["status"] == "succeeded" and job["result"]["test_accuracy"] > 0.5
    # the progress bar, fed by the event stream, ends at the last epoch with its scores and the
    # final status in place of the ETA; then the result
    assert "epoch 3 of 3" in submitted.stderr and "test acc" in submitted.stderr, submitted.stderr
    assert "ETA" not in submitted.stderr.splitlines()[-2]
    assert f"succeeded: test accuracy {job['result']['test_accuracy']:.4f}" in submitted.stderr

    watched = cli(service, "watch", job["id"], "--json", key=key)
    assert watched.returncode == 0, watched.stderr
    assert json.loads(watched.stdout)["id"] == job["id"]
    assert "epoch 3 of 3" in watched.stderr

    downloaded = cli(
        service, "download", job["id"], "--artifact", "weights.safetensors", "-o", str(tmp_path), "--json", key=key
    )
    assert downloaded.returncode == 0, downloaded.stderr
    [saved] = json.loads(downloaded.stdout)
    assert saved["name"] == "weights.safetensors"
    assert (tmp_path / "weights.safetensors").stat().st_size == saved["size_bytes"]
    assert not list(tmp_path.glob("*.part"))


def test_cli_says_the_key_is_wrong_or_the_server_is_down(service):
    for args in (["status", "some-job"], ["watch", "some-job"], ["submit", "--dataset", "digits"]):
        wrong = cli(service, *args, key="th_wrong")
        assert wrong.returncode == 1, args
        assert "401" in wrong.stderr and "TRAINHUB_API_KEY" in wrong.stderr, wrong.stderr
        assert "Traceback" not in wrong.stderr
    down = f"http://127.0.0.1:{free_port()}"
    for args in (["status", "some-job"], ["watch", "some-job"]):
        refused = cli(service, *args, key="th_whatever", url=down)
        assert refused.returncode == 1
        assert f"cannot reach trainhub at {down}" in refused.stderr and "TRAINHUB_API_URL" in refused.stderr
        assert "Traceback" not in refused.stderr
    missing = cli(service, "status", "some-job", key="")
    assert missing.returncode == 1 and "TRAINHUB_API_KEY" in missing.stderr
