"""The user-code row of `make bench`: the service spec's MLP written as user code (torch, the same
784-256-128-10 layers, ReLU and dropout as the built-in pytorch job), trained through the service
like the built-in one, in turns with built-in jobs. Its steady s/epoch should be within
USER_CODE_RATIO of the built-in job's (the same eager loop, in a sandboxed child); the child's start
cost is the extra time outside the trainer's clock: the user job's overhead_s minus the built-in
job's."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import httpx

USER_CODE_RATIO = 1.1
PAIRS = 3  # built-in and user-code jobs run in turn, each side's steady epoch the median over them

MLP = """
import math

from torch import nn


def build(input_shape, num_classes, hidden_sizes=(256, 128), dropout=0.2):
    sizes = [math.prod(input_shape), *hidden_sizes]
    layers = [nn.Flatten()]
    for n_in, n_out in zip(sizes, sizes[1:]):
        layers += [nn.Linear(n_in, n_out), nn.ReLU(), nn.Dropout(dropout)]
    return nn.Sequential(*layers, nn.Linear(sizes[-1], num_classes))
"""


def measure(client: httpx.Client, builtin_spec: dict, log: Callable[[str], None], pairs: int = PAIRS) -> dict:
    """Upload the MLP and run it once cold; then `pairs` times a built-in job of `builtin_spec` (a
    pytorch spec) and the user-code job with its data and epochs, one after the other, so both
    see the same machine (a shared 2-core machine's speed drifts by 10-20% over a minute).
    {"jobs": the user-code jobs, "builtin_jobs", "steady_epoch_s" and "builtin_steady_epoch_s"
    (medians over the pairs), "ratio", "child_start_s" (the median of user overhead_s minus the
    built-in overhead_s of its pair)}."""
    from bench.service import run_job

    response = client.post(
        "/code", params={"filename": "bench_mlp.py", "entrypoint": "bench_mlp:build"}, content=MLP.encode()
    )
    response.raise_for_status()
    model = {
        "code": response.json()["id"],
        "entrypoint": "bench_mlp:build",
        "kwargs": {"hidden_sizes": builtin_spec["model"]["hidden_sizes"], "dropout": builtin_spec["model"]["dropout"]},
    }
    spec = {**builtin_spec, "model": model}
    runs = [("user code, cold", spec)]
    for i in range(1, pairs + 1):
        runs += [(f"built-in, pair {i}", builtin_spec), (f"user code, pair {i}", spec)]
    jobs, builtins = [], []
    for label, job_spec in runs:
        log(f"service: job {label}")
        job = run_job(client, job_spec)
        if job["status"] != "succeeded":
            raise RuntimeError(f"service job {label} ended {job['status']}: {job['error']}")
        (builtins if job_spec is builtin_spec else jobs).append({**job, "label": label})
    paired = jobs[1:]
    steady = statistics.median(job["timings"]["steady_epoch_s"] for job in paired)
    builtin = statistics.median(job["timings"]["steady_epoch_s"] for job in builtins)
    return {
        "jobs": jobs,
        "builtin_jobs": builtins,
        "steady_epoch_s": steady,
        "builtin_steady_epoch_s": builtin,
        "ratio": steady / builtin,
        "child_start_s": statistics.median(u["overhead_s"] - b["overhead_s"] for u, b in zip(paired, builtins)),
    }
