"""A comparison through the whole service: both jobs run, the parity check passes, the table fills."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime

import pytest


def test_comparison_on_digits_passes_parity_and_fills_the_table(service):
    with service.client() as client:
        comparison = client.compare({"dataset": {"name": "digits"}, "epochs": 3, "batch_size": 64})
        comparison = client.wait_comparison(comparison["id"], timeout_s=240)
    assert comparison["status"] == "succeeded", comparison["error"]
    assert {job["status"] for job in comparison["jobs"].values()} == {"succeeded"}
    parity = comparison["parity"]
    assert parity["passed"], parity
    checks = {c["name"]: c for c in parity["checks"]}
    assert checks["first step loss"]["value"] <= 2e-5
    assert checks["epoch train loss"]["value"] <= 0.02
    assert checks["test predictions agree"]["value"] >= 0.95
    rows = {row["metric"]: row for row in comparison["table"]}
    assert rows["parameters"]["jax"] == rows["parameters"]["pytorch"] == 64 * 256 + 256 + 256 * 128 + 128 + 1290
    for metric in ("compile_s", "first_epoch_s", "steady_epoch_s", "samples_per_s", "test_accuracy", "test_loss"):
        assert rows[metric]["jax"] is not None and rows[metric]["pytorch"] is not None, metric
    assert rows["steady_epoch_s"]["ratio"] == pytest.approx(
        rows["steady_epoch_s"]["jax"] / rows["steady_epoch_s"]["pytorch"])
    assert rows["test_accuracy"]["jax"] == comparison["jobs"]["jax"]["result"]["test_accuracy"]
    # How long both ran at once, from the jobs' own clocks: their timings are honest about it.
    jax_job, torch_job = comparison["jobs"]["jax"], comparison["jobs"]["pytorch"]
    start = max(datetime.fromisoformat(jax_job["started_at"]), datetime.fromisoformat(torch_job["started_at"]))
    end = min(datetime.fromisoformat(jax_job["finished_at"]), datetime.fromisoformat(torch_job["finished_at"]))
    assert comparison["overlap_s"] == pytest.approx(max(0.0, (end - start).total_seconds()), abs=1e-3)


def test_cli_compare_prints_the_side_by_side_table(service):
    env = {**service.env, "TRAINHUB_API_URL": service.url, "TRAINHUB_API_KEY": service.new_key("cli")}
    done = subprocess.run([sys.executable, "-m", "app.cli", "compare", "--dataset", "digits", "--epochs", "2",
                           "--batch-size", "64"], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    for label in ("PyTorch", "JAX / PyTorch", "steady_epoch_s", "test_accuracy", "both frameworks trained the same"):
        assert label in done.stdout, done.stdout
    # `trainhub comparisons` lists it, newest first, with its parity check.
    listed = subprocess.run([sys.executable, "-m", "app.cli", "comparisons", "--json"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    [comparison] = json.loads(listed.stdout)
    assert comparison["status"] == "succeeded" and comparison["parity"]["passed"]
    table = subprocess.run([sys.executable, "-m", "app.cli", "comparisons"], env=env, capture_output=True, text=True,
                           timeout=60)
    assert comparison["id"][:8] in table.stdout and "passed" in table.stdout


def test_cli_export_writes_the_other_frameworks_format(service, tmp_path):
    import torch

    with service.client() as client:
        job = client.wait(client.submit({"framework": "jax", "dataset": {"name": "digits"}, "epochs": 1,
                                         "batch_size": 64})["id"], timeout_s=120)
        key = client.http.headers["Authorization"].split()[1]
    env = {**service.env, "TRAINHUB_API_URL": service.url, "TRAINHUB_API_KEY": key}
    done = subprocess.run([sys.executable, "-m", "app.cli", "export", job["id"], "--to", "pytorch", "-o",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    state_dict = torch.load(done.stdout.strip().splitlines()[-1], weights_only=True)
    assert state_dict["layers.0.weight"].shape == (256, 64)
    assert [p.name for p in tmp_path.iterdir()] == ["state_dict.pt"]  # nothing else left behind
