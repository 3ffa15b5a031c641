"""The benchmark's code paths at toy sizes (`python -m bench --quick`), and its verdicts.

These check that every part runs and reports what it measured, not how fast anything is: the
quick run is far too small for its numbers to mean anything.
"""

import json
import subprocess
import sys

import pytest

from bench import report
from bench.__main__ import summarize_loop
from bench.flops import cnn_macs_per_sample, mlp_flops_per_epoch
from bench.service import check_reachable
from tests.e2e.conftest import forget_unfinished_jobs

LOOPS = ["jax_seed", "jax_trainer", "torch_seed", "torch_seed_tensor", "torch_trainer", "torch_compile"]


# Under 1 min on a quiet machine; PyTorch slows 10x or more when the cores are shared.
pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def quick(database_url, redis_url, tmp_path_factory, repo_root):
    """One `python -m bench --quick` against the test database and Redis: (stdout, results).

    On a timeout subprocess.run kills the bench; the API and worker it started die with it
    (bench/procs.py), so no worker is left consuming the test queues."""
    # Earlier tests leave queued jobs (the fuzzer's among them); the bench's worker would run them.
    forget_unfinished_jobs(database_url)
    out = tmp_path_factory.mktemp("bench") / "results.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--out", str(out),
         "--database-url", database_url, "--redis-url", redis_url],
        cwd=repo_root, capture_output=True, text=True, timeout=540,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


@pytest.mark.e2e
def test_quick_run_measures_every_part(quick):
    stdout, results = quick

    assert results["quick"] is True
    assert results["machine"]["matmul_gflops"] > 0
    assert results["floor"]["floor_s"] > 0
    for name in LOOPS:
        loop = results["loops"][name]
        assert loop["steady_s"] > 0 and loop["first_epoch_s"] > 0, name
        assert 0 < loop["test_accuracy"] <= 1, name
        assert len(loop["rounds"][0]["epoch_times"]) == results["config"]["epochs"], name
    assert set(results["linearity"]) == {"jax", "pytorch"}
    assert all(lin["ratio"] > 0 for lin in results["linearity"].values())
    # Every criterion was judged (nothing skipped: the services were there) and is printed.
    assert len(results["criteria"]) >= 17
    assert all(c["passed"] in (True, False) for c in results["criteria"]), results["criteria"]
    for c in results["criteria"]:
        assert f"] {c['name']}: " in stdout
    assert "steady s" in stdout and "submit->done" in stdout
    # The CNN rows: both trainers on the same CNN, with its own floor.
    cnn = results["cnn"]
    assert set(cnn["loops"]) == {"jax_cnn", "torch_cnn"} and cnn["floor"]["floor_s"] > 0
    assert cnn["loops"]["jax_cnn"]["compilations"] == 1
    assert all(len(loop["rounds"][0]["epoch_times"]) == results["config"]["cnn_epochs"] for loop in cnn["loops"].values())
    assert "trainhub JAX trainer (flax, scan)" in stdout and "x floor" in stdout


@pytest.mark.e2e
def test_quick_run_counts_compilations(quick):
    _, results = quick
    loops = results["loops"]

    assert loops["jax_trainer"]["compilations"] == 1
    assert loops["jax_trainer"]["compile_s"] > 0
    assert loops["torch_trainer"]["compilations"] == 0 and loops["torch_trainer"]["compile_s"] == 0
    assert loops["torch_compile"]["compilations"] == 1 and loops["torch_compile"]["compile_s"] > 0
    for name in ("jax_trainer", "torch_trainer", "torch_compile"):
        timings = loops[name]["rounds"][0]["timings"]
        assert timings["train_s"] == pytest.approx(sum(loops[name]["rounds"][0]["epoch_times"]))


@pytest.mark.e2e
def test_quick_run_goes_through_the_service(quick):
    _, results = quick
    service, api = results["service"], results["api"]

    labels = [job["label"] for job in service["jobs"]]
    assert labels == ["jax, cold", "jax, warm", "pytorch, cold", "pytorch, warm",
                      "pytorch+compile, cold", "pytorch+compile, warm"]
    for job in service["jobs"]:
        assert job["status"] == "succeeded"
        assert job["submit_to_done_s"] >= job["timings"]["setup_s"] + job["timings"]["train_s"]
    assert service["compile_cache"]["first_compile_s"] > 0
    assert service["rss"]["jobs"] == results["config"]["rss_jobs"]
    assert service["rss"]["first_bytes"] > 0 and service["rss"]["last_bytes"] > 0
    # The load: every accepted job stored and queued exactly once, then cleaned up.
    assert api["post"]["accepted"] > 0
    assert api["integrity"]["exactly_once"], api["integrity"]
    assert api["get"]["statuses"] == {"200": api["get"]["requests"]}


def test_unreachable_services_are_named():
    why = check_reachable("postgresql+psycopg://postgres@127.0.0.1:1/nowhere", "redis://127.0.0.1:1/0")
    assert why and "127.0.0.1:1" in why


def test_flops_follow_the_issue():
    flops = mlp_flops_per_epoch(60000)
    assert flops["macs_per_sample"] == 784 * 256 + 256 * 128 + 128 * 10
    assert flops["flops"] / 1e9 == pytest.approx(84.5, abs=0.1)  # "about 85 GFLOP per epoch"
    assert flops["flops_needed"] < flops["flops"]


def test_cnn_flops_count_each_conv_at_its_input_size():
    # conv 1->32 on 28x28, pool to 14x14, conv 32->64, pool to 7x7, dense 3136->128->10
    expected = 28 * 28 * 1 * 32 * 9 + 14 * 14 * 32 * 64 * 9 + 7 * 7 * 64 * 128 + 128 * 10
    assert cnn_macs_per_sample() == expected


def test_steady_epoch_is_the_best_rounds_median():
    rounds = [{"epoch_times": [3.0, 1.0, 1.2], "test_accuracy": [0.5, 0.8, 0.85], "compile_s": None},
              {"epoch_times": [2.0, 0.9, 1.1], "test_accuracy": [0.5, 0.8, 0.85], "compile_s": None}]
    summary = summarize_loop(rounds)
    assert summary["steady_by_round"] == pytest.approx([1.1, 1.0])  # median of epochs 2..n
    assert summary["steady_s"] == pytest.approx(1.0)  # the best round
    assert summary["first_epoch_s"] == pytest.approx(2.0)
    assert summary["test_accuracy"] == 0.85


def _loop(steady_s, accuracy):
    return {"steady_s": steady_s, "test_accuracy": accuracy}


def test_verdicts_pass_fail_and_not_measured():
    results = {
        "config": {"api_post_s": 10},
        "floor": {"floor_s": 0.47},
        "loops": {"jax_seed": _loop(0.88, 0.88), "jax_trainer": _loop(0.50, 0.875),
                  "torch_seed": _loop(1.85, 0.88), "torch_trainer": _loop(1.70, 0.88),
                  "torch_compile": _loop(0.84, 0.86)},
        "linearity": {"jax": {"small_n": 1, "large_n": 4, "small_s": 1.0, "large_s": 4.2, "ratio": 4.2}},
        "service": {"skipped": "no database"},
        "api": {"skipped": "no database"},
    }
    verdicts = {c.name: c.passed for c in report.criteria(results)}

    assert verdicts["JAX trainer steady epoch vs seeds' JAX loop"] is True      # 0.57 x
    assert verdicts["JAX trainer steady epoch vs floor"] is True                # 1.06 x
    assert verdicts["PyTorch trainer (eager) steady epoch vs seed"] is False    # 0.92 x
    assert verdicts["PyTorch trainer (compile) steady epoch vs seed"] is True   # 0.45 x
    assert verdicts["final test accuracy, PyTorch trainer, compile vs seed"] is False  # 0.02 apart
    assert verdicts["cost linear in samples, jax"] is True
    assert verdicts["service overhead, warm worker"] is None
    assert verdicts["POST /jobs accepted rate"] is None
    lines = report.criteria_lines(report.criteria(results))
    assert any(line.startswith("[SKIP] service overhead") for line in lines)
    assert any("no database" in line for line in lines)
