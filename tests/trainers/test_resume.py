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


# Timings are measured, so they differ; every other number of an epoch must be the same bits.
TIMINGS = ("epoch_time_s", "eval_time_s", "samples_per_s")
# 1437 // 16 = 89 steps an epoch: the JAX trainer runs them in chunks of up to 45, the PyTorch
# one asks should_stop every 50; a cosine schedule makes the learning rate differ at every step.
HANDED_BACK = {"dataset": {"name": "digits"}, "epochs": 3, "batch_size": 16, "model": {"dropout": 0.2},
               "optimizer": {"schedule": "cosine"}}
STEPS = 89


@pytest.fixture
def steps_run(monkeypatch):
    """A list that gets one item per training step each trainer runs (a spy on its own code)."""
    from trainers import jax_trainer, torch_trainer

    ran: list[int] = []
    chunk = jax_trainer._chunk

    def counted_chunk(*args, **kwargs):
        batch_idx, step_ids, valid = chunk(*args, **kwargs)
        ran.extend(step_ids[valid].tolist())  # the steps of the epoch this call runs
        return batch_idx, step_ids, valid

    make_step = torch_trainer.make_train_step

    def counted_make_step(*args, **kwargs):
        step = make_step(*args, **kwargs)

        def counted(x, y):
            ran.append(len(ran))
            return step(x, y)

        return counted

    monkeypatch.setattr(jax_trainer, "_chunk", counted_chunk)
    monkeypatch.setattr(torch_trainer, "make_train_step", counted_make_step)
    return ran


def stop_mid_epoch(reason: str, ran: list[int], after: int):
    """should_stop: StopTraining(reason) at the first look after `after` steps that is not at an
    epoch's end (where an epoch checkpoint would do)."""

    def should_stop():
        if len(ran) >= after and len(ran) % STEPS:
            raise StopTraining(reason)

    return should_stop


def numbers(metrics):
    return [{k: v for k, v in m.to_dict().items() if k not in TIMINGS} for m in metrics]


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
@pytest.mark.parametrize(("reason", "model"),
                         [("preempted", "preset"), ("preempted", "layers"), ("shutdown", "preset")])
def test_a_run_handed_back_mid_epoch_resumes_at_the_step_it_stopped(framework, model, reason, steps_run, tmp_path):
    spec = JobSpec(framework=framework, **{**HANDED_BACK, **({"model": LAYERS} if model == "layers" else {})})
    whole = fit(spec, tmp_path / "whole", lambda e, m: None)
    assert len(steps_run) == 3 * STEPS
    steps_run.clear()

    with pytest.raises(StopTraining):
        fit(spec, tmp_path / "handed-back", lambda e, m: None, stop_mid_epoch(reason, steps_run, STEPS + 20))
    done = len(steps_run)
    assert STEPS < done < 2 * STEPS  # stopped in epoch 2, between two chunks
    steps_run.clear()
    reported = []
    resumed = fit(spec, tmp_path / "handed-back", lambda e, m: reported.append(e))

    assert len(steps_run) == 3 * STEPS - done  # no step before the stop ran again
    assert reported == [1, 2, 3]
    assert numbers(resumed.metrics) == numbers(whole.metrics)  # the same bits as an uninterrupted run
    assert resumed.result == whole.result


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_a_run_stopped_in_epoch_1_keeps_its_first_step_loss(framework, steps_run, tmp_path):
    spec = JobSpec(framework=framework, **HANDED_BACK)
    whole = fit(spec, tmp_path / "whole", lambda e, m: None)
    steps_run.clear()
    with pytest.raises(StopTraining):
        fit(spec, tmp_path / "handed-back", lambda e, m: None, stop_mid_epoch("preempted", steps_run, 40))
    resumed = fit(spec, tmp_path / "handed-back", lambda e, m: None)
    assert numbers(resumed.metrics) == numbers(whole.metrics)
    assert resumed.result["first_step_loss"] == whole.result["first_step_loss"]


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
@pytest.mark.parametrize("reason", ["cancelled", "superseded"])
def test_a_run_that_ends_keeps_its_last_epoch_checkpoint(framework, reason, steps_run, tmp_path):
    # The job ends, or another worker has it (and may write this workdir): nothing is written
    # mid-epoch, and a later run in the workdir starts the epoch it was in again.
    spec = JobSpec(framework=framework, **HANDED_BACK)
    with pytest.raises(StopTraining):
        fit(spec, tmp_path, lambda e, m: None, stop_mid_epoch(reason, steps_run, STEPS + 20))
    steps_run.clear()
    fit(spec, tmp_path, lambda e, m: None)
    assert len(steps_run) == 2 * STEPS


def test_a_compiled_run_handed_back_mid_epoch_resumes_at_the_step_it_stopped(steps_run, tmp_path):
    # The compiled whole step (trainers.torch_step): its dropout keys, optimizer state and the
    # schedule's rate carry over a mid-epoch checkpoint as the eager step's do.
    spec = JobSpec(framework="pytorch", compile=True, **HANDED_BACK)
    whole = fit(spec, tmp_path / "whole", lambda e, m: None)
    steps_run.clear()
    with pytest.raises(StopTraining):
        fit(spec, tmp_path / "handed-back", lambda e, m: None, stop_mid_epoch("preempted", steps_run, STEPS + 20))
    done = len(steps_run)
    assert STEPS < done < 2 * STEPS
    steps_run.clear()
    resumed = fit(spec, tmp_path / "handed-back", lambda e, m: None)

    assert len(steps_run) == 3 * STEPS - done
    assert numbers(resumed.metrics) == numbers(whole.metrics)
    assert resumed.result == whole.result
