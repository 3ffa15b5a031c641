"""The parity check passes for the same spec in both frameworks and fails for different training."""

from __future__ import annotations

from safetensors.numpy import load_file

from trainers import JobSpec, fit, parity
from trainers.data import load_dataset

SPEC = {"dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64}


def run(tmp_path, framework: str, **overrides) -> dict:
    workdir = tmp_path / f"{framework}-{len(list(tmp_path.iterdir()))}"
    result = fit(JobSpec(framework=framework, **{**SPEC, **overrides}), workdir, lambda e, m: None)
    return {"first_step_loss": result.result["first_step_loss"],
            "train_losses": [m.train_loss for m in result.metrics],
            "weights": load_file(workdir / "weights.safetensors")}


def test_same_spec_passes(tmp_path):
    x_test = load_dataset(JobSpec(framework="jax", **SPEC).dataset).x_test
    report = parity.check(run(tmp_path, "jax"), run(tmp_path, "pytorch"), x_test, dropout=0.0)
    assert report["passed"], report
    assert [c["name"] for c in report["checks"]] == ["first step loss", "epoch train loss", "test predictions agree"]


def test_a_different_learning_rate_is_caught(tmp_path):
    x_test = load_dataset(JobSpec(framework="jax", **SPEC).dataset).x_test
    other = run(tmp_path, "pytorch", optimizer={"learning_rate": 0.05})
    report = parity.check(run(tmp_path, "jax"), other, x_test, dropout=0.0)
    assert not report["passed"]
    assert "epoch train loss" in report["message"] and "not comparable" in report["message"]
    # the first step is still the same: same weights, same batch, before any update
    assert report["checks"][0]["passed"]


def test_with_dropout_only_predictions_are_compared(tmp_path):
    x_test = load_dataset(JobSpec(framework="jax", **SPEC).dataset).x_test
    runs = [run(tmp_path, fw, model={"dropout": 0.2}) for fw in ("jax", "pytorch")]
    report = parity.check(*runs, x_test, dropout=0.2)
    assert [c["name"] for c in report["checks"]] == ["test predictions agree"]
    assert "dropout on" in report["message"]
