"""Priorities through the real stack (uvicorn, one `trainhub worker`, PostgreSQL, Redis): a high
job waiting behind a running low one on the only worker preempts it; the low one goes back to
the queue, resumes at the chunk where it stopped and ends with the metrics of an uninterrupted run."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import running_service, wait_for

# ~0.2 s an epoch on one core, ~5 s in all: long enough to be caught mid-run by the scheduler's
# once-a-second look for a job to preempt, even on a loaded machine.
LOW = {"framework": "jax", "dataset": {"name": "fashion-mnist", "train_limit": 6000, "test_limit": 1000},
       "batch_size": 32, "epochs": 24, "priority": "low"}
HIGH = {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1, "priority": "high"}
TIMINGS = ("epoch_time_s", "eval_time_s", "samples_per_s")  # measured: the rest must be equal


@pytest.fixture
def one_worker(database_url, redis_url, tmp_path):
    """The API and one cpu worker, beating its heartbeat every half second (one stack per test:
    the other test's worker must not take these jobs)."""
    with running_service(database_url, redis_url, tmp_path, heartbeat_s="0.5") as svc:
        yield svc


def scores(job: dict) -> list[dict]:
    return [{name: value for name, value in m.items() if name not in TIMINGS} for m in job["metrics"]]


def test_a_high_job_preempts_a_low_one_that_resumes_to_identical_results(one_worker):
    with one_worker.client() as client:
        low = client.submit(LOW)
        wait_for(lambda: client.get(low["id"])["progress"]["epoch"] >= 1, 120, "the low job's first epoch")
        high = client.submit(HIGH)
        high_done = client.wait(high["id"], timeout_s=120)
        low_then = client.get(low["id"])
        low_done = client.wait(low["id"], timeout_s=300)
        alone = client.wait(client.submit({**LOW, "priority": "normal"})["id"], timeout_s=300)
    assert high_done["status"] == "succeeded"
    # The high job ran while the low one was back in the queue, not after it.
    assert low_then["status"] in ("queued", "running") and low_then["preempted"] == 1
    assert low_done["finished_at"] > high_done["finished_at"]
    assert low_done["status"] == "succeeded" and low_done["preempted"] == 1 and low_done["attempts"] == 1
    assert [m["epoch"] for m in low_done["metrics"]] == list(range(1, LOW["epochs"] + 1))
    assert scores(low_done) == scores(alone)  # the same numbers as a run nobody interrupted
    assert alone["preempted"] == 0


def test_with_preemption_off_a_high_job_waits_for_the_free_worker(database_url, redis_url, tmp_path):
    with running_service(database_url, redis_url, tmp_path, heartbeat_s="0.5", preemption="false") as svc:
        with svc.client() as client:
            low = client.submit({**LOW, "epochs": 4})
            wait_for(lambda: client.get(low["id"])["progress"]["epoch"] >= 1, 120, "the low job's first epoch")
            high = client.wait(client.submit(HIGH)["id"], timeout_s=120)
            low_done = client.get(low["id"])
    assert high["status"] == "succeeded" and low_done["status"] == "succeeded"
    assert low_done["preempted"] == 0 and low_done["finished_at"] < high["finished_at"]
