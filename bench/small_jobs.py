"""The many-small-jobs row (issue 23): how many one-epoch digits MLP jobs one cpu worker runs a
second, end to end, and where each job's time goes.

For each framework, a warm-up job first (it compiles, and fills the caches), then `jobs` jobs
submitted back to back over HTTP; the rate is jobs / (the last one's finished_at - the moment
the first POST was sent): API, worker and bench share the machine's clock. The per-job figures
are the means of the jobs' own timings (claim, data, setup, compile, train, eval, checkpoint,
artifacts, report = the status and metric writes), and `other_s` is the rest of the per-job
interval (HTTP, the broker's hop, Celery's dispatch, reading the spec, ending the job).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from bench.service import Service, _parse_time, run_job

# The parts of a job's interval that its timings name, in the order a job goes through them.
PARTS = ("claim_s", "data_s", "setup_s", "compile_s", "train_s", "eval_s", "checkpoint_s", "artifacts_s", "report_s")
FRAMEWORKS = ("jax", "pytorch")


def small_spec(framework: str, label: str = "small-jobs") -> dict:
    """A one-epoch digits MLP job (1,437 training samples, 11 steps of 128)."""
    return {"framework": framework, "epochs": 1, "dataset": {"name": "digits"},
            "model": {"hidden_sizes": [256, 128], "dropout": 0.0}, "labels": {"bench": label}}


def measure(service: Service, jobs: int, log: Callable[[str], None] = print,
            frameworks: tuple[str, ...] = FRAMEWORKS) -> dict:
    """{framework: figures} for `jobs` jobs of each framework on the service's one worker.
    Raises RuntimeError when a job does not succeed."""
    out = {}
    with service.client() as client:
        for framework in frameworks:
            warm = run_job(client, small_spec(framework))  # compiles; not counted
            if warm["status"] != "succeeded":
                raise RuntimeError(f"the warm-up {framework} job ended {warm['status']}: {warm['error']}")
            log(f"small jobs: {jobs} one-epoch digits {framework} jobs, submitted back to back")
            out[framework] = burst(client, framework, jobs)
            log(f"  {out[framework]['jobs_per_s']:.1f} jobs/s, {out[framework]['per_job_s'] * 1e3:.0f} ms a job")
    return out


def burst(client: httpx.Client, framework: str, jobs: int, timeout_s: float = 600.0) -> dict:
    """Submit `jobs` jobs at once, wait for all of them; the rate and the mean breakdown."""
    sent = time.time()
    ids = []
    for _ in range(jobs):
        response = client.post("/jobs", json=small_spec(framework))
        response.raise_for_status()
        ids.append(response.json()["id"])
    done = wait_all(client, ids, timeout_s)
    failed = [job for job in done if job["status"] != "succeeded"]
    if failed:
        raise RuntimeError(f"{len(failed)} of {jobs} small {framework} jobs did not succeed: {failed[0].get('error')}")
    span_s = max(_parse_time(job["finished_at"]) for job in done) - sent
    means = {part: sum((job["timings"] or {}).get(part) or 0.0 for job in done) / jobs for part in PARTS}
    per_job_s = span_s / jobs
    return {"jobs": jobs, "span_s": span_s, "jobs_per_s": jobs / span_s, "per_job_s": per_job_s,
            "overhead_s": per_job_s - means["train_s"], "means": means,
            "other_s": per_job_s - sum(means.values()),
            "queue_wait_s_max": max((job["timings"] or {}).get("queue_wait_s", 0.0) for job in done)}


def wait_all(client: httpx.Client, ids: list[str], timeout_s: float, poll_s: float = 0.25) -> list[dict]:
    """The jobs `ids` once every one has ended. Jobs of one key run in order, so this mostly
    polls the last one (few requests: the API shares the cores with the worker)."""
    deadline = time.monotonic() + timeout_s
    pending = list(ids)
    finished: dict[str, dict] = {}
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(pending)} small jobs still not done after {timeout_s} s")
        job = client.get(f"/jobs/{pending[-1]}").json()
        if job["status"] not in ("succeeded", "failed", "cancelled", "pruned"):
            time.sleep(poll_s)
            continue
        finished[job["id"]] = job
        pending.pop()
        for job_id in list(pending):  # the rest have most likely ended already
            job = client.get(f"/jobs/{job_id}").json()
            if job["status"] in ("succeeded", "failed", "cancelled", "pruned"):
                finished[job_id] = job
                pending.remove(job_id)
    return [finished[job_id] for job_id in ids]
