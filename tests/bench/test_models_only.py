"""`python -m bench --only models`: the CNN and resnet8 rows alone, merged into a results file.

A toy-size run (`--quick`): it checks what the run reports and keeps, not how fast anything is.
"""

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(600)


def test_only_models_measures_both_rows_and_keeps_the_rest_of_the_results(repo_root, tmp_path):
    out = tmp_path / "results.json"
    kept = {"api": {"post_rate_per_s": 123.0}, "config": {"epochs": 10}}
    out.write_text(json.dumps({**kept, "cnn": {"stale": True}}))

    done = subprocess.run(
        [sys.executable, "-m", "bench", "--only", "models", "--quick", "--out", str(out)],
        cwd=repo_root, capture_output=True, text=True, timeout=540,
    )

    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(out.read_text())
    assert results["api"] == kept["api"] and results["config"] == kept["config"]
    cnn, resnet = results["cnn"], results["resnet8"]
    assert "stale" not in cnn
    for row, loops in ((cnn, ("jax_cnn", "torch_cnn")), (resnet, ("jax_resnet8", "torch_resnet8"))):
        assert row["matmul_gflops"] > 0
        assert row["floor"]["floor_s"] > 0
        assert set(row["loops"]) == set(loops)
        for loop in row["loops"].values():
            assert loop["steady_s"] > 0 and 0 <= loop["test_accuracy"] <= 1
    # Both rows' floors come from the same probes: the better of the two taken around them.
    assert cnn["matmul_gflops"] == resnet["matmul_gflops"]
    assert resnet["loops"]["jax_resnet8"]["vs_floor"] == pytest.approx(
        resnet["loops"]["jax_resnet8"]["steady_s"] / resnet["floor"]["floor_s"])
    (verdict,) = [c for c in results["criteria"] if c["name"] == "JAX trainer CNN steady epoch vs the CNN's floor"]
    assert verdict["passed"] in (True, False) and "floor" in verdict["measured"]
    assert "JAX trainer CNN steady epoch vs the CNN's floor" in done.stdout
    assert "resnet8 loop" in done.stdout
