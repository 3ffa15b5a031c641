"""The user-code row of `make bench`: the service spec's MLP written as user code (torch, the same
784-256-128-10 layers, ReLU and dropout as the built-in pytorch job), trained through the service
like the built-in one. Its steady s/epoch should be within USER_CODE_RATIO of the built-in job's
(the same eager loop, in a sandboxed child); the child's start cost is the extra time outside the
trainer's clock: the user job's overhead_s minus the built-in job's."""

from __future__ import annotations

from collections.abc import Callable

import httpx

USER_CODE_RATIO = 1.1

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


def measure(client: httpx.Client, builtin_spec: dict, builtin_job: dict, log: Callable[[str], None]) -> dict:
    """Upload the MLP, run it cold then warm with `builtin_spec`'s data and epochs (a pytorch spec);
    {"jobs": [cold, warm], "steady_epoch_s", "builtin_steady_epoch_s", "ratio", "child_start_s"}."""
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
    jobs = []
    for label in ("user code, cold", "user code, warm"):
        log(f"service: job {label}")
        job = run_job(client, spec)
        if job["status"] != "succeeded":
            raise RuntimeError(f"service job {label} ended {job['status']}: {job['error']}")
        jobs.append({**job, "label": label})
    warm = jobs[-1]
    steady, builtin = warm["timings"]["steady_epoch_s"], builtin_job["timings"]["steady_epoch_s"]
    return {
        "jobs": jobs,
        "steady_epoch_s": steady,
        "builtin_steady_epoch_s": builtin,
        "ratio": steady / builtin,
        "child_start_s": warm["overhead_s"] - builtin_job["overhead_s"],
    }
