"""`python -m bench.gpu_check --hardware cpu --quick` (`make gpu-check HARDWARE=cpu`): the GPU
check's code paths on the CPU, over the embedded stack (SQLite and the local broker under the
test's own folder: no PostgreSQL or Redis).

It checks that every part ran and reported what it measured, not how fast anything is.
"""

import json
import os
import subprocess
import sys

import pytest

from trainers.data import installed_built_ins

# Under a minute on a quiet 2-core machine; PyTorch slows 10x or more when the cores are shared.
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        "fashion-mnist" not in installed_built_ins(),
        reason="needs Fashion-MNIST (make data: Debian's dataset-fashion-mnist, or TRAINHUB_DATA_DIR)",
    ),
]


@pytest.fixture(scope="module")
def quick(tmp_path_factory, repo_root):
    """One quick cpu run in a folder of its own: (stdout, results). On a timeout subprocess.run
    kills the check; the API and worker it started die with it (app.stack.Child)."""
    folder = tmp_path_factory.mktemp("gpu_check")
    out = folder / "gpu_check.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINHUB_") or k == "TRAINHUB_DATA_DIR"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.gpu_check", "--hardware", "cpu", "--quick",
         "--out", str(out), "--var-dir", str(folder / "var")],
        cwd=repo_root, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


def test_every_job_succeeds_and_bf16_is_skipped_with_the_reason(quick):
    stdout, results = quick

    assert results["ok"] is True and results["failures"] == []
    assert results["hardware"] == "cpu" and results["quick"] is True
    assert results["date"] and results["versions"]["jax"] and results["versions"]["torch"]
    jobs = {job["name"]: job for job in results["jobs"]}
    ran = [job for job in jobs.values() if not job["skipped"]]
    # fp32 Fashion-MNIST and large MLP jobs, in both frameworks, and the comparison
    assert {(j["kind"], j["framework"]) for j in ran} == {
        ("fashion-mnist", "jax"), ("fashion-mnist", "pytorch"),
        ("large-mlp", "jax"), ("large-mlp", "pytorch"), ("comparison", None),
    }  # fmt: skip
    for job in ran:
        assert job["status"] == "succeeded", job
        if job["kind"] != "comparison":
            assert job["precision"] == "fp32"
            assert job["timings"]["steady_epoch_s"] > 0, job
            assert 0 < job["test_accuracy"] <= 1, job
            assert len(job["epoch_times_s"]) == (
                results["config"]["epochs"] if job["kind"] == "fashion-mnist" else results["config"]["large_epochs"]
            )
            assert job["worker"]["hardware"] == "cpu"
    # bf16 is refused on cpu: skipped, in the spec's words, and said so
    skipped = [job for job in jobs.values() if job["skipped"]]
    assert {j["precision"] for j in skipped} == {"bf16"} and len(skipped) == 4
    assert all("bf16" in j["skipped"] and "gpu" in j["skipped"] for j in skipped)
    assert stdout.count("skipped gpu-check") == 4
    assert "gpu-check passed" in stdout


def test_the_comparison_passes_parity(quick):
    _, results = quick
    [comparison] = [job for job in results["jobs"] if job["kind"] == "comparison"]

    assert comparison["status"] == "succeeded"
    assert comparison["parity"]["passed"] is True
    assert {c["name"] for c in comparison["parity"]["checks"]} >= {"first step loss", "test predictions agree"}
    assert set(comparison["jobs"]) == {"jax", "pytorch"}
    assert all(side["status"] == "succeeded" for side in comparison["jobs"].values())


def test_the_large_mlp_reports_its_flops_against_the_matmul_rate(quick):
    stdout, results = quick
    config = results["config"]
    rows = results["large_mlp"]

    assert {row["framework"] for row in rows} == {"jax", "pytorch"}
    assert results["machine"]["matmul"]["fp32_gflops"] > 0
    for row in rows:
        # 3 x the forward FLOPs of model_plan x the whole batches of an epoch
        assert row["samples"] == config["large_steps"] * config["large_batch"]
        assert row["flops"] == 3 * row["forward_flops_per_example"] * row["samples"]
        assert row["achieved_gflops"] > 0 and row["of_matmul"] > 0
        assert row["achieved_gflops"] == pytest.approx(row["flops"] / row["steady_epoch_s"] / 1e9)
    assert "GFLOP/s" in stdout and "of matmul" in stdout
