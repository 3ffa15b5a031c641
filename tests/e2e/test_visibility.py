"""A Redis visibility timeout shorter than a job: the message is handed out again while the job
trains, and the second delivery does nothing."""

from __future__ import annotations

from tests.e2e.conftest import RedisServer, running_service, wait_for


def test_a_redelivered_running_job_is_not_run_twice(database_url, tmp_path):
    broker = RedisServer(tmp_path)
    broker.start()
    try:
        with running_service(database_url, broker.url, tmp_path / "svc", workers=0, visibility_timeout_s="1") as svc:
            logs = [tmp_path / "worker-0.log", tmp_path / "worker-1.log"]
            for i, log in enumerate(logs):
                svc.start_worker("--hardware", "cpu", "--devices", str(i % 2), log=log)
            wait_for(lambda: all(log.is_file() and " ready." in log.read_text() for log in logs), 120, "two workers")
            spec = {"framework": "pytorch", "epochs": 10, "batch_size": 32,
                    "dataset": {"name": "fashion-mnist", "train_limit": 6000, "test_limit": 1000}}
            with svc.client() as client:
                job = client.wait(client.submit(spec)["id"], timeout_s=300)
            output = "".join(log.read_text() for log in logs)
    finally:
        broker.stop()
    assert job["status"] == "succeeded", job["error"]
    assert job["attempts"] == 1
    assert [m["epoch"] for m in job["metrics"]] == list(range(1, 11))
    # the broker did hand it out again, and that delivery was skipped
    assert f"no job waits in the queue of job {job['id']} (a duplicate or stale message); skipping" in output
