"""What makes a stream of small jobs cheap, and must not change their results: a worker keeps a
JAX run's compiled programs for the next run of the same shape (never for another), no
checkpoint is written after the last epoch (the weights are stored anyway, and a run killed
before its end still resumes), and tiny PyTorch steps run on one thread."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainers import JobSpec, RunOptions, StopTraining, fit, jax_trainer
from trainers.torch_trainer import threads_for

KEEP = RunOptions(keep_programs=True)  # as a worker runs its jobs
SPEC = {"dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64, "model": {"dropout": 0.2}}


def numbers(result) -> list[tuple]:
    return [(m.train_loss, m.train_accuracy, m.test_loss, m.test_accuracy) for m in result.metrics]


def test_identical_specs_share_the_compiled_programs_with_identical_results(tmp_path):
    jax_trainer.forget_programs()
    spec = JobSpec(framework="jax", **SPEC)
    first = fit(spec, tmp_path / "a", lambda e, m: None, options=KEEP)
    second = fit(spec, tmp_path / "b", lambda e, m: None, options=KEEP)
    # Another seed and name change no program: reused, with its own (seeded) results.
    reseeded = fit(JobSpec(framework="jax", **{**SPEC, "seed": 1, "name": "other"}), tmp_path / "c", lambda e, m: None,
                   options=KEEP)
    alone = fit(spec, tmp_path / "d", lambda e, m: None)  # a library caller's run keeps nothing

    assert first.timings["compilations"] == 1 and alone.timings["compilations"] == 1
    assert second.timings["compilations"] == 0 and reseeded.timings["compilations"] == 0
    assert numbers(second) == numbers(first)
    assert numbers(reseeded) != numbers(first)
    assert len(jax_trainer._programs) == 1


@pytest.mark.parametrize("change", [{"batch_size": 32}, {"model": {"dropout": 0.0, "hidden_sizes": [32]}},
                                    {"optimizer": {"name": "sgd", "learning_rate": 0.1}}, {"epochs": 3}])
def test_a_spec_that_changes_the_program_gets_its_own(change, tmp_path):
    jax_trainer.forget_programs()
    fit(JobSpec(framework="jax", **SPEC), tmp_path / "a", lambda e, m: None, options=KEEP)
    other = JobSpec(framework="jax", **{**SPEC, **change})
    kept = fit(other, tmp_path / "b", lambda e, m: None, options=KEEP)
    jax_trainer.forget_programs()
    fresh = fit(other, tmp_path / "c", lambda e, m: None, options=KEEP)

    assert kept.timings["compilations"] == 1  # built for it, not borrowed from the first spec
    assert numbers(kept) == numbers(fresh)


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_a_one_epoch_run_stores_its_weights_without_a_checkpoint(framework, tmp_path):
    result = fit(JobSpec(framework=framework, **{**SPEC, "epochs": 1}), tmp_path, lambda e, m: None)

    assert "weights.safetensors" in result.artifacts and (tmp_path / "weights.safetensors").stat().st_size > 0
    assert result.timings["checkpoint_s"] == 0.0
    assert not (tmp_path / "checkpoints").exists() or not any((tmp_path / "checkpoints").iterdir())


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_a_run_killed_in_its_last_epoch_resumes_to_the_same_end(framework, tmp_path):
    spec = JobSpec(framework=framework, **SPEC)
    whole = fit(spec, tmp_path / "whole", lambda e, m: None)

    def killed_at_the_end(epoch, metrics):
        if epoch == spec.epochs:  # reported, but the worker dies before it stores the weights
            raise StopTraining("killed", "as if the worker died here")

    with pytest.raises(StopTraining):
        fit(spec, tmp_path / "killed", killed_at_the_end)
    reported = []
    resumed = fit(spec, tmp_path / "killed", lambda e, m: reported.append(e))

    assert reported == [1, 2]  # epoch 1 from its checkpoint, epoch 2 trained again
    for a, b in zip(numbers(whole), numbers(resumed), strict=True):
        assert a == pytest.approx(b, abs=1e-6)


def test_tiny_pytorch_steps_run_on_one_thread():
    cores = len(os.sched_getaffinity(0))
    assert threads_for(JobSpec(framework="pytorch", **SPEC)) == 1  # the digits MLP: ~20 MFLOP a step
    large = JobSpec(framework="pytorch", dataset={"name": "fashion-mnist"}, model={"hidden_sizes": [1024, 1024]})
    assert threads_for(large) == cores
    # a convolution keeps every core, however small (one-thread convolutions round differently)
    small_cnn = JobSpec(framework="pytorch", **{**SPEC, "model": {"name": "cnn", "channels": [4], "hidden_sizes": [16]}})
    assert threads_for(small_cnn) == cores


def test_the_digits_split_is_kept_for_the_next_worker(tmp_path, monkeypatch):
    import sys

    import numpy as np

    from trainers import data
    from trainers.spec import DatasetSpec

    data._digits.cache_clear()
    first = data.load_dataset(DatasetSpec(name="digits"), tmp_path)
    assert len(list(tmp_path.glob("digits-*.npz"))) == 1
    data._digits.cache_clear()  # as in a fresh worker, which cannot import scikit-learn here
    monkeypatch.setitem(sys.modules, "sklearn.datasets", None)
    again = data.load_dataset(DatasetSpec(name="digits"), tmp_path)
    data._digits.cache_clear()

    for name in ("x_train", "y_train", "x_test", "y_test"):
        assert np.array_equal(getattr(first, name), getattr(again, name)) and getattr(again, name).dtype == getattr(
            first, name).dtype
    assert len(again.x_train) == 1437


def test_an_eager_adam_run_and_its_resume_never_import_dynamo(tmp_path):
    """torch._dynamo takes ~1.3 s to import: a fresh worker's first eager job (the seeds' Adam)
    trains, checkpoints and resumes without it (torch_trainer.skip_dynamo_import)."""
    code = (
        "import sys, pathlib\n"
        "from trainers import JobSpec, StopTraining, fit\n"
        "spec = JobSpec(framework='pytorch', dataset={'name': 'digits'}, epochs=3)\n"
        f"workdir = pathlib.Path({str(tmp_path)!r})\n"
        "def stop_after_2(epoch, metrics):\n"
        "    if epoch == 2: raise StopTraining('preempted')\n"
        "try: fit(spec, workdir, stop_after_2)\n"
        "except StopTraining: pass\n"
        "resumed = fit(spec, workdir, lambda e, m: None)\n"
        "assert [m.epoch for m in resumed.metrics] == [1, 2, 3]\n"
        "assert 'torch._dynamo' not in sys.modules, 'dynamo was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
