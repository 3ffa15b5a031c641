"""A fleet of real worker processes, each serving only some `<hardware>.<framework>` queues, with
artifacts in an S3 API server (moto on loopback) as workers on other hosts would use:

- routing: a cpu.jax-only and a cpu.pytorch-only worker each get only their jobs; a job for a
  queue nobody serves waits with its reason and position, and runs as soon as a worker for that
  queue starts. (No GPU here: a gpu job just waits; `--frameworks` starts the missing worker.)
- a message sent to the wrong queue is never run by the worker that got it;
- a worker whose heartbeat stops (SIGSTOP) is shown offline and its running job goes back to
  the queue, then finishes when a worker for it is back.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import time

import boto3
import pytest
import redis

from tests.e2e.conftest import wait_for, running_service

DIGITS = {"dataset": {"name": "digits"}, "epochs": 1, "batch_size": 64}
# ~0.2 s an epoch on one core: long enough to stop the worker mid-run.
SLOW = {"dataset": {"name": "fashion-mnist", "train_limit": 6000, "test_limit": 2000}, "batch_size": 32}
FAST_RECOVERY = {"heartbeat_s": "0.5", "worker_timeout_s": "3"}
S3 = {"s3_prefix": "fleet/", "s3_region": "us-east-1", "s3_access_key_id": "testing", "s3_secret_access_key": "testing"}




class Fleet:
    def __init__(self, service, bucket: str, s3) -> None:
        self.service = service
        self.bucket = bucket
        self.s3 = s3
        # An admin key: these tests find each worker by its pid, which only an admin key sees.
        self.client = service.client(service.new_key("fleet", admin=True))
        self.workers: dict[str, subprocess.Popen] = {}

    def start_worker(self, label: str, *args: str) -> str:
        """Start `trainhub worker ARGS`; its name (hostname:pid:instance) once its heartbeat says it is online."""
        process = self.service.start_worker(*args)
        self.workers[label] = process
        return wait_for(lambda: self.online_name(process.pid) or (process.poll() is not None and pytest.fail(
            f"worker {args} exited with {process.returncode}")), 90, f"worker {label} online")

    def online_name(self, pid: int) -> str | None:
        return next((w["name"] for w in self.client.workers()["workers"]
                     if f":{pid}:" in w["name"] and w["online"]), None)

    def worker_row(self, name: str) -> dict:
        return next(w for w in self.client.workers()["workers"] if w["name"] == name)


@pytest.fixture(scope="module")
def fleet(database_url, redis_url, s3_server, tmp_path_factory):
    """The API with no worker yet, on PostgreSQL, Redis and an S3 bucket; tests start workers."""
    redis.Redis.from_url(redis_url).flushdb()
    s3 = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1", aws_access_key_id="testing",
                      aws_secret_access_key="testing")
    bucket = "trainhub-fleet"
    s3.create_bucket(Bucket=bucket)
    with running_service(database_url, redis_url, tmp_path_factory.mktemp("fleet"), workers=0,
                         artifact_store="s3", s3_bucket=bucket, s3_endpoint_url=s3_server,
                         **S3, **FAST_RECOVERY) as svc:
        fleet = Fleet(svc, bucket, s3)
        yield fleet
        fleet.client.close()


def one_core(i: int) -> list[str]:
    return ["--devices", str(i % os.cpu_count())]


def test_each_worker_gets_only_its_queue_and_a_waiting_job_runs_when_its_worker_appears(fleet, tmp_path):
    client = fleet.client
    jax_worker = fleet.start_worker("jax", "--hardware", "cpu", "--frameworks", "jax", *one_core(0))
    assert fleet.worker_row(jax_worker)["queues"] == ["cpu.jax"]

    waiting = client.submit({**DIGITS, "framework": "pytorch"})
    gpu = client.submit({**DIGITS, "framework": "jax", "hardware": "gpu"})
    # (earlier modules' workers may look online for worker_timeout_s after they stopped)
    wait_for(lambda: client.get(waiting["id"])["waiting_reason"] == "no online worker serves cpu.pytorch", 20,
             "cpu.pytorch to have no worker")
    assert client.get(waiting["id"])["queue_position"] == 1
    first_jax = client.wait(client.submit({**DIGITS, "framework": "jax"})["id"], timeout_s=120)
    assert first_jax["status"] == "succeeded", first_jax["error"]
    assert first_jax["worker"]["name"] == jax_worker
    still = client.get(waiting["id"])
    assert still["status"] == "queued" and still["attempts"] == 0  # the jax worker never took it

    torch_worker = fleet.start_worker("pytorch", "--hardware", "cpu", "--frameworks", "pytorch", *one_core(1))
    ran = client.wait(waiting["id"], timeout_s=120)
    assert ran["status"] == "succeeded", ran["error"]
    assert ran["worker"]["name"] == torch_worker and ran["attempts"] == 1

    # Both at once, as a comparison: each side on its own worker; the parity check reads the
    # other side's weights from the bucket, not from a disk the two workers share.
    comparison = client.wait_comparison(client.compare(DIGITS)["id"], timeout_s=180)
    assert comparison["status"] == "succeeded", comparison["error"]
    assert comparison["jobs"]["jax"]["worker"]["name"] == jax_worker
    assert comparison["jobs"]["pytorch"]["worker"]["name"] == torch_worker
    assert comparison["parity"]["passed"]

    fleet_view = client.workers()
    rows = {w["name"]: w for w in fleet_view["workers"]}
    assert rows[jax_worker]["queues"] == ["cpu.jax"] and set(rows[jax_worker]["versions"]) == {"jax"}
    assert rows[torch_worker]["queues"] == ["cpu.pytorch"] and set(rows[torch_worker]["versions"]) == {"pytorch"}
    assert rows[jax_worker]["devices"] == ["cpu:0"] and rows[jax_worker]["online"] and rows[torch_worker]["online"]
    queues = {q["name"]: q for q in fleet_view["queues"]}
    assert queues["gpu.jax"]["workers_online"] == 0 and queues["gpu.jax"]["depth"] >= 1

    # The gpu job never ran on a cpu worker: it waits, saying why.
    gpu = client.get(gpu["id"])
    assert gpu["status"] == "queued" and gpu["attempts"] == 0 and gpu["worker"] is None
    assert gpu["waiting_reason"] == "no online worker serves gpu.jax" and gpu["queue_position"] >= 1
    client.cancel(gpu["id"])

    # Artifacts went to the bucket and come back through the API, checksums and all.
    for job in (first_jax, ran):
        listing = fleet.s3.list_objects_v2(Bucket=fleet.bucket, Prefix=f"fleet/{job['id']}/")
        keys = {o["Key"] for o in listing["Contents"]}
        assert {f"fleet/{job['id']}/{a['name']}" for a in job["artifacts"]} == keys
        path = client.download(job["id"], "weights.safetensors", tmp_path / job["id"])
        listed = {a["name"]: a for a in job["artifacts"]}["weights.safetensors"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == listed["sha256"]
        part = client.http.get(f"/jobs/{job['id']}/artifacts/spec.json", headers={"Range": "bytes=0-9"})
        assert part.status_code == 206 and len(part.content) == 10


def test_a_message_on_the_wrong_queue_is_never_run(fleet):
    from app.config import Settings
    from app.queue import RUN_JOB_TASK, make_celery

    client = fleet.client
    broker_url = fleet.service.env["TRAINHUB_BROKER_URL"]
    broker = redis.Redis.from_url(broker_url)
    gpu = client.submit({**DIGITS, "framework": "jax", "hardware": "gpu"})
    on_gpu_queue = broker.llen("gpu.jax")
    # Its id reaches the cpu.jax worker anyway (a hand-sent or stale message).
    make_celery(Settings(broker_url=broker_url)).send_task(RUN_JOB_TASK, args=[gpu["id"]], queue="cpu.jax")
    after = client.wait(client.submit({**DIGITS, "framework": "jax"})["id"], timeout_s=120)
    assert after["status"] == "succeeded"  # the worker took the misrouted message first, then this one
    assert broker.llen("cpu.jax") == 0
    assert broker.llen("gpu.jax") == on_gpu_queue + 1  # sent back to its own queue, unclaimed
    gpu = client.get(gpu["id"])
    assert gpu["status"] == "queued" and gpu["attempts"] == 0 and gpu["started_at"] is None
    assert gpu["waiting_reason"] == "no online worker serves gpu.jax"
    client.cancel(gpu["id"])


def test_a_worker_whose_heartbeat_stops_is_offline_and_its_job_is_not_left_running(fleet):
    client = fleet.client
    torch_process = fleet.workers["pytorch"]
    torch_worker = fleet.online_name(torch_process.pid)
    job = client.submit({**SLOW, "framework": "pytorch", "epochs": 15})
    wait_for(lambda: (j := client.get(job["id"]))["status"] == "running" and j["progress"]["epoch"] >= 1, 120,
             "the job to train on the pytorch worker")
    torch_process.send_signal(signal.SIGSTOP)  # hung: no heartbeat, no progress
    try:
        wait_for(lambda: not fleet.worker_row(torch_worker)["online"], 20, "the worker to show offline")
        requeued = wait_for(lambda: (j := client.get(job["id"]))["status"] == "queued" and j, 20,
                            "the job to go back to its queue")
        assert requeued["attempts"] == 1
        assert requeued["retries"] == 1 and requeued["last_error"]["type"] == "worker_lost"  # the policy's default
        assert requeued["waiting_reason"].startswith("retry 1 after worker_lost (")
        assert requeued["waiting_reason"].endswith("): no online worker serves cpu.pytorch")
        assert {q["name"]: q for q in client.workers()["queues"]}["cpu.pytorch"]["workers_online"] == 0
    finally:
        torch_process.send_signal(signal.SIGCONT)
    # The worker comes back: its stale run is fenced off, and it resumes the job from the checkpoint.
    done = client.wait(job["id"], timeout_s=180)
    assert done["status"] == "succeeded", done["error"]
    assert done["attempts"] == 2 and done["retries"] == 1 and done["error"] is None
    assert [m["epoch"] for m in done["metrics"]] == list(range(1, 16))
    assert fleet.worker_row(torch_worker)["online"]


def test_a_data_parallel_job_waits_for_a_worker_that_owns_its_devices(fleet):
    client = fleet.client
    # The workers so far own one core (one device) each: a job asking for two waits, saying why.
    ddp = {**DIGITS, "batch_size": 64, "devices": 2}
    waiting = client.submit({**ddp, "framework": "pytorch"})
    reason = ("no online worker owns 2 cpu devices for pytorch (queue cpu.pytorch.x2); start one with "
              "`trainhub worker --hardware cpu --devices 0,1 --cpu-devices 2`")
    wait_for(lambda: client.get(waiting["id"])["waiting_reason"] == reason, 20, "the two-device job to wait")
    assert client.get(waiting["id"])["queue_position"] == 1

    if len(os.sched_getaffinity(0)) < 2:
        client.cancel(waiting["id"])
        pytest.skip("a two-device cpu worker needs two cores")
    wide = fleet.start_worker("wide", "--hardware", "cpu", "--devices", "0,1", "--cpu-devices", "2")
    row = fleet.worker_row(wide)
    assert row["queues"] == ["cpu.jax", "cpu.jax.x2", "cpu.pytorch", "cpu.pytorch.x2"]
    assert row["devices"] == ["cpu:0", "cpu:1"]
    jax_job = client.submit({**ddp, "framework": "jax"})
    for job in (client.wait(waiting["id"], timeout_s=180), client.wait(jax_job["id"], timeout_s=180)):
        assert job["status"] == "succeeded", job["error"]
        assert job["worker"]["name"] == wide and job["worker"]["devices"] == ["cpu:0", "cpu:1"]
        assert len(job["metrics"]) == 1 and job["result"]["test_accuracy"] > 0.5
    fleet.workers.pop("wide").terminate()


def test_a_worker_stopped_cleanly_leaves_the_fleet_at_once(fleet):
    name = fleet.start_worker("leaving", "--hardware", "cpu", "--frameworks", "jax", *one_core(0))
    process = fleet.workers.pop("leaving")
    process.send_signal(signal.SIGTERM)  # a warm shutdown, as `docker stop` or systemd sends
    assert process.wait(timeout=60) == 0
    # Its heartbeat row is gone: not listed as online (nor as recently seen) for worker_timeout_s.
    assert name not in [w["name"] for w in fleet.client.workers()["workers"]]
