"""Checkpoints: a run stopped after an epoch and started again in the same workdir ends exactly
like a run never interrupted; a loss that stops being finite ends the run naming the epoch."""

from __future__ import annotations

import pytest

from trainers import JobSpec, NanLoss, StopTraining, fit

SPEC = {"dataset": {"name": "digits"}, "epochs": 3, "batch_size": 64, "model": {"dropout": 0.2}}
# A layer list: batch norm statistics, dropout masks and a residual's projection resume too.
LAYERS = {"layers": [{"type": "conv2d", "filters": 4}, {"type": "batch_norm"}, {"type": "relu"},
                     {"type": "residual", "layers": [{"type": "conv2d", "filters": 8}, {"type": "relu"}]},
                     {"type": "max_pool"}, {"type": "flatten"}, {"type": "dropout", "rate": 0.2},
                     {"type": "dense", "units": 10}]}


def stop_after(epochs: int):
    def report(epoch, metrics):
        if epoch == epochs:
            raise StopTraining("killed", "as if the worker died here")

    return report


@pytest.mark.parametrize("model", ["preset", "layers"])
@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_resumed_run_matches_an_uninterrupted_one(framework, model, tmp_path):
    spec = JobSpec(framework=framework, **{**SPEC, **({"model": LAYERS} if model == "layers" else {})})
    whole = fit(spec, tmp_path / "whole", lambda e, m: None)

    with pytest.raises(StopTraining):
        fit(spec, tmp_path / "resumed", stop_after(2))
    reported = []
    resumed = fit(spec, tmp_path / "resumed", lambda e, m: reported.append(e))

    assert reported == [1, 2, 3]  # the checkpointed epochs are reported again, then epoch 3
    for a, b in zip(whole.metrics, resumed.metrics, strict=True):
        for name in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), abs=1e-6), (a.epoch, name)
    assert resumed.result["test_accuracy"] == pytest.approx(whole.result["test_accuracy"], abs=1e-6)
    assert resumed.result["first_step_loss"] == pytest.approx(whole.result["first_step_loss"], abs=1e-6)


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_a_diverging_loss_fails_naming_the_epoch(framework, tmp_path):
    spec = JobSpec(framework=framework, dataset={"name": "digits"}, epochs=3, batch_size=64,
                   optimizer={"learning_rate": 1e4}, model={"hidden_sizes": [256] * 8})
    with pytest.raises(NanLoss, match=r"in epoch \d; lower optimizer.learning_rate"):
        fit(spec, tmp_path, lambda e, m: None)
