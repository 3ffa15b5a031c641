"""Jobs through the whole service: HTTP -> PostgreSQL -> Redis -> worker process -> artifacts."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from app.client import ApiError
from tests.e2e.conftest import damaged_dataset_job, wait_for

DIGITS = {"dataset": {"name": "digits"}, "epochs": 3, "batch_size": 64}




@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_job_runs_to_success_with_metrics_timings_and_artifacts(service, tmp_path, framework):
    with service.client() as client:
        job = client.submit({**DIGITS, "framework": framework})
        job = client.wait(job["id"], timeout_s=180)
        assert job["status"] == "succeeded", job["error"]
        assert job["attempts"] == 1
        assert [m["epoch"] for m in job["metrics"]] == [1, 2, 3]
        assert job["result"]["test_accuracy"] == job["metrics"][-1]["test_accuracy"] > 0.85
        timings = job["timings"]
        for name in ("queue_wait_s", "setup_s", "compile_s", "first_epoch_s", "steady_epoch_s", "train_s", "total_s"):
            assert timings[name] >= 0, name
        assert timings["train_s"] == pytest.approx(sum(m["epoch_time_s"] for m in job["metrics"]), rel=1e-3)
        assert timings["total_s"] >= timings["train_s"]
        assert job["worker"]["hardware"] == "cpu" and job["worker"]["devices"]
        assert client.get(job["id"])["progress"] == {"epoch": 3, "epochs": 3}

        native = "params.msgpack" if framework == "jax" else "state_dict.pt"
        listed = {a["name"]: a for a in client.artifacts(job["id"])}
        assert set(listed) == {"weights.safetensors", native, "metrics.json", "spec.json"}
        for name, artifact in listed.items():
            path = client.download(job["id"], name, tmp_path)
            data = path.read_bytes()
            assert len(data) == artifact["size_bytes"]
            assert hashlib.sha256(data).hexdigest() == artifact["sha256"]
        weights = load_file(tmp_path / "weights.safetensors")
        assert weights["layers.0.weight"].shape == (256, 64)
        assert weights["layers.2.weight"].shape == (10, 128)
        assert client.http.get(f"/jobs/{job['id']}/metrics").json() == job["metrics"]


def test_range_request_on_an_artifact(service):
    with service.client() as client:
        job = client.wait(client.submit({**DIGITS, "framework": "jax", "epochs": 1})["id"], timeout_s=120)
        response = client.http.get(f"/jobs/{job['id']}/artifacts/spec.json", headers={"Range": "bytes=0-9"})
        assert response.status_code == 206
        assert response.content == client.http.get(f"/jobs/{job['id']}/artifacts/spec.json").content[:10]


def test_fashion_mnist_slice_from_the_debian_package(service):
    spec = {"framework": "pytorch", "dataset": {"name": "fashion-mnist", "train_limit": 3000, "test_limit": 1000},
            "epochs": 2}
    with service.client() as client:
        job = client.wait(client.submit(spec)["id"], timeout_s=180)
    assert job["status"] == "succeeded", job["error"]
    assert job["result"]["test_accuracy"] > 0.6


def test_cancel_running_job_keeps_its_finished_epochs(service):
    with service.client() as client:
        job = client.submit({**DIGITS, "framework": "pytorch", "epochs": 1000, "batch_size": 16})
        wait_for(lambda: client.get(job["id"])["progress"]["epoch"] >= 1, 120, "the first epoch")
        assert client.cancel(job["id"])["status"] in ("running", "cancelled")
        job = client.wait(job["id"], timeout_s=60)
    assert job["status"] == "cancelled"
    assert 1 <= len(job["metrics"]) < 1000
    assert job["finished_at"] is not None


def test_cli_cancel_stops_a_job_of_slow_steps_within_its_first_epoch(service):
    # Wide convolutions: each step takes about a second here, an epoch 20 of them. The worker
    # checks for a cancel between steps, not only between whole chunks of 20.
    spec = {"framework": "jax", "dataset": {"name": "fashion-mnist", "train_limit": 2560, "test_limit": 256},
            "model": {"name": "cnn", "channels": [256, 256]}, "epochs": 1, "batch_size": 128}
    key = service.new_key("cancel")
    with service.client(key) as client:
        job = client.submit(spec)
        wait_for(lambda: client.get(job["id"])["status"] == "running", 120, "the job to start")
    cancelled = run_cli(service, "cancel", job["id"][:8], "--wait", key=key)
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.split() == ["cancelled"]
    with service.client(key) as client:
        job = client.get(job["id"])
    assert job["status"] == "cancelled" and job["metrics"] == []  # stopped inside epoch 1
    again = run_cli(service, "cancel", job["id"], key=key)  # idempotent, as the API is
    assert again.returncode == 0 and again.stdout.split() == ["cancelled"]


def test_duplicate_delivery_does_not_run_a_job_twice(service):
    from app.config import Settings
    from app.queue import RUN_JOB_TASK, make_celery

    with service.client() as client:
        job = client.wait(client.submit({**DIGITS, "framework": "jax", "epochs": 1})["id"], timeout_s=120)
        assert job["status"] == "succeeded"
        # Deliver its id again, as a broker redelivery would.
        celery = make_celery(Settings(broker_url=service.env["TRAINHUB_BROKER_URL"]))
        celery.send_task(RUN_JOB_TASK, args=[job["id"]], queue="cpu.jax")
        # A later job on the same queue runs after the duplicate, so the duplicate was consumed.
        later = client.wait(client.submit({**DIGITS, "framework": "jax", "epochs": 1})["id"], timeout_s=120)
        assert later["status"] == "succeeded"
        again = client.get(job["id"])
        assert again["attempts"] == 1
        assert again["finished_at"] == job["finished_at"]
        assert len(again["metrics"]) == 1 and len(again["artifacts"]) == 4


def test_missing_data_is_refused_or_fails_clearly_and_worker_goes_on(service, tmp_path):
    # MNIST is not installed on these machines and the network is closed: the worker says so in
    # its heartbeat, so a job naming it is refused at submit, with how to get it.
    with service.client() as client:
        with pytest.raises(ApiError) as refused:
            client.submit({"framework": "jax", "dataset": {"name": "mnist"}, "epochs": 1})
        assert refused.value.status_code == 422 and "'mnist' is not installed" in str(refused.value)
        assert "fashion-mnist" in str(refused.value)  # what the workers do have
        # Data damaged after upload is found by the worker's hash check: the job fails plainly.
        job = client.wait(damaged_dataset_job(service, client, tmp_path, epochs=1)["id"], timeout_s=180)
        assert job["status"] == "failed"
        assert (job["error"]["type"], job["error"]["reason"]) == ("data_error", "dataset_corrupt"), job["error"]
        assert "upload the dataset again" in job["error"]["message"]
        assert str(service.artifact_dir) not in job["error"]["message"] and "/tmp" not in job["error"]["message"]
        assert job["metrics"] == [] and job["artifacts"] == []
        after = client.wait(client.submit({**DIGITS, "framework": "pytorch", "epochs": 1})["id"], timeout_s=120)
        assert after["status"] == "succeeded"


def test_a_gpu_job_waits_with_its_reason(service):
    with service.client() as client:
        job = client.submit({**DIGITS, "framework": "pytorch", "hardware": "gpu"})
        time.sleep(1)
        job = client.get(job["id"])
        assert job["status"] == "queued"
        assert job["waiting_reason"] == "no online worker serves gpu.pytorch"
        assert client.cancel(job["id"])["status"] == "cancelled"


def test_submit_wait_says_at_once_why_a_job_waits_and_stops_at_its_timeout(service):
    """Issue 16, item 14: a queue no online worker serves was a silent wait forever."""
    key = service.new_key("timeout")
    started = time.monotonic()
    waited = run_cli(service, "submit", "--framework", "jax", "--hardware", "gpu", "--dataset", "digits",
                     "--wait", "--timeout", "3", key=key)
    assert waited.returncode == 124, waited.stderr
    assert time.monotonic() - started < 60
    said = " ".join(waited.stderr.split())
    assert "waits: no online worker serves gpu.jax" in said and "still queued after 3 s" in said
    with service.client(key) as client:
        [job] = client.list(status="queued")["items"]
        client.cancel(job["id"])


def test_download_all_fetches_every_artifact_checked(service, tmp_path):
    with service.client() as client:
        job = client.wait(client.submit({**DIGITS, "framework": "jax", "epochs": 1})["id"], timeout_s=120)
        seen = []
        files = client.download_all(job["id"], tmp_path, on_progress=lambda name, done, total: seen.append(name))
    assert sorted(f.name for f in files) == sorted(a["name"] for a in job["artifacts"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(a["name"] for a in job["artifacts"])
    assert set(seen) == {a["name"] for a in job["artifacts"]}


def test_wrong_key_is_refused(service):
    with service.client("th_not-a-real-key") as client:
        with pytest.raises(ApiError) as error:
            client.submit({**DIGITS, "framework": "jax"})
    assert error.value.status_code == 401


def run_cli(service, *args: str, key: str | None) -> subprocess.CompletedProcess:
    env = {**service.env, "TRAINHUB_API_URL": service.url, "TRAINHUB_API_KEY": key or ""}
    return subprocess.run([sys.executable, "-m", "app.cli", *args], env=env, capture_output=True, text=True,
                          timeout=240)


def test_cli_submit_wait_status_and_download(service, tmp_path):
    key = service.new_key("cli")
    submitted = run_cli(service, "submit", "--framework", "pytorch", "--dataset", "digits", "--epochs", "2",
                        "--batch-size", "64", "--wait", key=key)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().splitlines()[-1]
    assert "succeeded: test accuracy" in submitted.stderr
    status = run_cli(service, "status", job_id, "--json", key=key)
    assert json.loads(status.stdout)["status"] == "succeeded"
    table = run_cli(service, "status", job_id[:8].upper(), key=key)  # a short id, as copied from a listing
    assert table.returncode == 0, table.stderr
    worker = json.loads(status.stdout)["worker"]
    assert f"{worker['name']} on {worker['devices'][0]}" in " ".join(table.stdout.split())
    # A --spec file's framework is the one submitted (the --framework default does not replace it).
    spec_file = tmp_path.parent / "spec.json"
    spec_file.write_text(json.dumps({"framework": "pytorch", "dataset": {"name": "digits"}, "epochs": 1}))
    from_file = run_cli(service, "submit", "--spec", str(spec_file), "--json", key=key)
    assert json.loads(from_file.stdout)["spec"]["framework"] == "pytorch", from_file.stderr
    # `trainhub list` shows the key's jobs with the API's filters, as a table or as the JobPage.
    listed = json.loads(run_cli(service, "list", "--status", "succeeded", "--json", key=key).stdout)
    assert job_id in [job["id"] for job in listed["items"]]
    assert all(job["status"] == "succeeded" for job in listed["items"])
    table = run_cli(service, "list", "--framework", "pytorch", key=key)
    assert table.returncode == 0 and job_id[:8] in table.stdout, table.stderr
    assert run_cli(service, "list", "--status", "bogus", key=key).returncode == 2  # typer names the choices
    downloaded = run_cli(service, "download", job_id, "-o", str(tmp_path), key=key)
    assert downloaded.returncode == 0, downloaded.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json", "spec.json", "state_dict.pt",
                                                          "weights.safetensors"]


def test_cli_says_when_the_key_is_wrong_or_the_spec_is_bad(service):
    wrong = run_cli(service, "submit", "--dataset", "digits", key="th_wrong")
    assert wrong.returncode == 1
    assert "401" in wrong.stderr and "TRAINHUB_API_KEY" in wrong.stderr
    bad = run_cli(service, "submit", "--dataset", "digits", "--epochs", "0", key=service.new_key())
    assert bad.returncode == 1
    assert "epochs" in bad.stderr
