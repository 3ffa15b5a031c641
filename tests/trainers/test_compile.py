"""`"compile": true`: the PyTorch step compiled with torch.compile, its time in compile_s.

Behaviour, not speed: how many graphs are compiled per job (one, before the first epoch, and
none during training), that compile_s and the epoch times are present and consistent, that a
second identical job reuses the compiled step, and that compiling changes nothing about what
is learned.
"""

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from trainers import JobSpec, fit
from trainers import torch_trainer


@pytest.fixture
def fresh_dynamo():
    """Forget every compiled step, as in a new worker process."""
    torch.compiler.reset()
    torch_trainer._compiled_steps.clear()
    yield
    torch.compiler.reset()
    torch_trainer._compiled_steps.clear()


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory):
    """The shared digits spec with dropout 0.2, trained eager, compiled, then compiled again."""
    torch.compiler.reset()
    torch_trainer._compiled_steps.clear()
    spec = {"dataset": {"name": "digits"}, "batch_size": 16, "epochs": 3, "seed": 0, "model": {"dropout": 0.2}}
    runs = {}
    for name, compile in (("eager", False), ("compiled", True), ("again", True)):
        reported = []
        result = fit(JobSpec(framework="pytorch", compile=compile, **spec), tmp_path_factory.mktemp(name),
                     lambda epoch, metrics: reported.append(epoch))
        runs[name] = (result, reported)
    return runs


def test_compile_is_opt_in_and_part_of_the_spec():
    assert JobSpec(framework="pytorch").compile is False
    spec = JobSpec.model_validate_json('{"framework": "pytorch", "compile": true}')
    assert spec.compile is True and spec.model_dump(mode="json")["compile"] is True
    assert "torch.compile" in JobSpec.model_fields["compile"].description


def test_compile_is_refused_for_pytorch_on_tpu():
    with pytest.raises(ValidationError, match="compile"):
        JobSpec(framework="pytorch", hardware="tpu", compile=True)
    assert JobSpec(framework="jax", hardware="tpu", compile=True).compile  # JAX compiles anyway


def test_one_graph_compiled_before_training_and_none_during_it(compiled_runs):
    result, reported = compiled_runs["compiled"]
    timings = result.timings

    assert reported == [1, 2, 3]
    # One graph for the step; model.eval() for the evaluation between epochs recompiles nothing.
    assert timings["compilations"] == 1
    assert timings["compile_s"] > 0


@pytest.mark.parametrize("name", ["eager", "compiled", "again"])
def test_compile_s_and_epoch_times_are_present_and_consistent(compiled_runs, name):
    result, _ = compiled_runs[name]
    timings = result.timings
    epoch_times = [m.epoch_time_s for m in result.metrics]

    assert all(t > 0 for t in epoch_times)
    assert timings["train_s"] == pytest.approx(sum(epoch_times))
    assert timings["first_epoch_s"] == epoch_times[0]
    assert timings["steady_epoch_s"] == pytest.approx(np.median(epoch_times[1:]))
    assert timings["setup_s"] > 0 and timings["compile_s"] >= 0
    if name == "eager":
        assert timings["compile_s"] == 0 and timings["compilations"] == 0


def test_a_second_identical_job_reuses_the_compiled_step(compiled_runs):
    first, _ = compiled_runs["compiled"]
    again, _ = compiled_runs["again"]

    assert again.timings["compilations"] == 0
    assert again.timings["compile_s"] < first.timings["compile_s"]


def test_compile_gives_the_same_accuracy(compiled_runs):
    eager, _ = compiled_runs["eager"]
    compiled, _ = compiled_runs["compiled"]
    again, _ = compiled_runs["again"]

    # Dropout masks come from another RNG once compiled, so the runs are close, not identical.
    assert compiled.result["test_accuracy"] == pytest.approx(eager.result["test_accuracy"], abs=0.02)
    assert compiled.result["test_accuracy"] > 0.9
    # The first step's loss is computed before any dropout mask matters much: the same init and batch.
    assert compiled.result["first_step_loss"] == pytest.approx(eager.result["first_step_loss"], rel=0.05)
    # Compiled runs are reproducible from the spec.
    assert again.result["test_accuracy"] == compiled.result["test_accuracy"]


def test_without_dropout_compiled_training_matches_eager_closely(tmp_path, digits_spec, digits_runs, fresh_dynamo):
    eager = digits_runs["pytorch"].result
    compiled = fit(digits_spec("pytorch", compile=True), tmp_path, lambda epoch, metrics: None)

    assert compiled.timings["compilations"] == 1
    assert compiled.result["first_step_loss"] == pytest.approx(eager.result["first_step_loss"], rel=1e-5)
    for mine, theirs in zip(compiled.metrics, eager.metrics):
        assert mine.train_loss == pytest.approx(theirs.train_loss, rel=1e-3)
        assert mine.test_accuracy == pytest.approx(theirs.test_accuracy, abs=0.01)


@pytest.mark.parametrize("model", [{}, {"batch_norm": True}], ids=["whole-step", "module"])
def test_many_different_models_keep_being_compiled(tmp_path, digits_spec, fresh_dynamo, model):
    # Past recompile_limit different steps, dynamo would quietly run the step eagerly for good;
    # the trainer starts afresh before that, so every job still gets its compiled step. (Not
    # monkeypatch.setattr: its undo deletes the setting from dynamo's config module.)
    with torch._dynamo.config.patch(recompile_limit=2):
        for i, hidden in enumerate(([32], [48], [64])):
            result = fit(digits_spec("pytorch", compile=True, epochs=1, model={"hidden_sizes": hidden, **model}),
                         tmp_path / str(i), lambda epoch, metrics: None)
            assert result.timings["compilations"] == 1, hidden


def test_jax_ignores_compile(tmp_path, digits_spec, digits_runs):
    result = fit(digits_spec("jax", compile=True), tmp_path, lambda epoch, metrics: None)

    assert result.timings["compilations"] == 1
    assert result.result["test_accuracy"] == digits_runs["jax"].result.result["test_accuracy"]
