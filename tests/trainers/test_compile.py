"""`"compile": true`: the PyTorch step compiled with torch.compile, its time in compile_s.

Behaviour, not speed: how many graphs are compiled per job (one, before the first epoch, and
none during training), that compile_s and the epoch times are present and consistent, that a
second identical job reuses the compiled step, and that compiling changes nothing about what
is learned.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from safetensors.numpy import load_file

from trainers import JobSpec, RunOptions, fit, torch_step, torch_trainer
from trainers.dataset_file import DatasetArrays, write


@pytest.fixture
def fresh_dynamo():
    """Forget every compiled step, as in a new worker process."""
    forget_compiled_steps()
    yield
    forget_compiled_steps()


def forget_compiled_steps() -> None:
    torch.compiler.reset()
    torch_trainer._compiled_steps.clear()
    torch_step.reset()  # the steps compiled ahead of time, which torch.compiler.reset() leaves


@pytest.fixture(scope="module")
def compiled_runs(tmp_path_factory):
    """The shared digits spec with dropout 0.2, trained eager, compiled, then compiled again."""
    forget_compiled_steps()
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


def test_a_new_worker_loads_the_compiled_step_an_earlier_one_saved(tmp_path, digits_spec, fresh_dynamo):
    # A worker keeps each compiled step in its compile cache; a new worker process (here: this
    # one with every compiled step forgotten) loads it instead of compiling, and trains the same.
    spec = digits_spec("pytorch", compile=True, epochs=2, model={"dropout": 0.2})
    options = RunOptions(compile_cache_dir=tmp_path / "cache")

    def run(name: str):
        forget_compiled_steps()
        result = fit(spec, tmp_path / name, lambda epoch, metrics: None, options=options)
        return result, load_file(tmp_path / name / "weights.safetensors")

    (first, first_weights) = run("first")
    [saved] = (tmp_path / "cache" / "torch-steps").iterdir()
    (loaded, loaded_weights) = run("loaded")
    saved.write_bytes(b"not a compiled step")
    (recompiled, recompiled_weights) = run("recompiled")

    assert first.timings["compilations"] == 1
    assert loaded.timings["compilations"] == 0  # nothing traced or lowered: the step came from the disk
    assert recompiled.timings["compilations"] == 1  # a damaged file is compiled again...
    assert saved.read_bytes() != b"not a compiled step"  # ...and replaced
    for name, weight in first_weights.items():
        assert np.array_equal(loaded_weights[name], weight) and np.array_equal(recompiled_weights[name], weight)
    assert learned(loaded) == learned(first) == learned(recompiled)
    assert first.result["test_accuracy"] > 0.9


# A fresh worker process: the job's step from the compile cache, and which modules it took.
FRESH_WORKER = """
import json, sys
from pathlib import Path
from trainers import JobSpec, RunOptions, fit
spec = JobSpec.model_validate_json(sys.argv[1])
result = fit(spec, sys.argv[2], lambda epoch, metrics: None, options=RunOptions(compile_cache_dir=Path(sys.argv[3])))
imported = [name for name in ("torch._dynamo", "torch._inductor.lowering") if name in sys.modules]
print(json.dumps({"compilations": result.timings["compilations"], "imported": imported,
                  "accuracy": result.result["test_accuracy"]}))
"""


def test_a_fresh_worker_runs_a_saved_step_without_dynamo_or_inductor(tmp_path, digits_spec, fresh_dynamo):
    # What a fresh worker's first compiled job waits for (issue 23's cold start): the step from
    # the compile cache, loaded by torch's C++ loader alone, with nothing traced or imported for it.
    spec = digits_spec("pytorch", compile=True, epochs=2, model={"dropout": 0.2})
    cache = tmp_path / "cache"
    first = fit(spec, tmp_path / "first", lambda epoch, metrics: None, options=RunOptions(compile_cache_dir=cache))

    done = subprocess.run([sys.executable, "-c", FRESH_WORKER, spec.model_dump_json(), str(tmp_path / "fresh"),
                           str(cache)], capture_output=True, text=True, timeout=300)

    assert done.returncode == 0, done.stderr[-3000:]
    fresh = json.loads(done.stdout.strip().splitlines()[-1])
    assert fresh == {"compilations": 0, "imported": [], "accuracy": first.result["test_accuracy"]}


def test_a_saved_step_made_for_other_inputs_is_compiled_again(tmp_path, digits_spec, fresh_dynamo):
    # The compiled graph checks no shapes: a file under another step's name (a copy by hand, a
    # bug in the naming) is refused by the inputs its metadata names, and replaced.
    options = RunOptions(compile_cache_dir=tmp_path / "cache")
    small, large = (digits_spec("pytorch", compile=True, epochs=1, model={"hidden_sizes": [h]}) for h in (32, 64))
    fit(small, tmp_path / "small", lambda e, m: None, options=options)
    [small_step] = (tmp_path / "cache" / "torch-steps").iterdir()
    first = fit(large, tmp_path / "large", lambda e, m: None, options=options)
    [large_step] = set((tmp_path / "cache" / "torch-steps").iterdir()) - {small_step}
    shutil.copyfile(small_step, large_step)
    forget_compiled_steps()

    again = fit(large, tmp_path / "again", lambda e, m: None, options=options)

    assert again.timings["compilations"] == 1
    assert large_step.read_bytes() != small_step.read_bytes()
    assert learned(again) == learned(first)


def test_where_aot_inductor_fails_the_module_is_compiled_instead(tmp_path, digits_spec, fresh_dynamo, monkeypatch):
    # A step AOTInductor cannot build (an operator it cannot lower, a wrapper that does not
    # link) still trains compiled: the module path, forward and backward through Dynamo.
    tried = []

    def unbuildable(*args, **kwargs):
        tried.append(1)
        raise RuntimeError("no compiler for the wrapper")

    monkeypatch.setattr(torch_step, "_compile_package", unbuildable)
    options = RunOptions(compile_cache_dir=tmp_path / "cache")
    result = fit(digits_spec("pytorch", compile=True, epochs=2), tmp_path / "run", lambda e, m: None, options=options)
    again = fit(digits_spec("pytorch", compile=True, epochs=2), tmp_path / "again", lambda e, m: None, options=options)

    assert result.timings["compilations"] == 1
    assert not (tmp_path / "cache" / "torch-steps").exists()
    assert result.result["test_accuracy"] > 0.9
    # The worker does not try again for every job (it fails late, after seconds of tracing).
    assert len(tried) == 1 and again.timings["compilations"] == 0
    assert learned(again) == learned(result)


def test_compiled_steps_past_the_cache_bound_leave_the_least_recently_used_first(tmp_path, digits_spec, fresh_dynamo):
    # A year of jobs of many shapes: the host's compiled steps stay within compile_cache_max_bytes.
    cache = tmp_path / "cache"

    def run(hidden: int, max_bytes: int):
        forget_compiled_steps()  # a new worker each time: the step comes from the disk or is compiled
        spec = digits_spec("pytorch", compile=True, epochs=1, model={"hidden_sizes": [hidden]})
        options = RunOptions(compile_cache_dir=cache, compile_cache_max_bytes=max_bytes)
        return fit(spec, tmp_path / f"{hidden}-{len(list(tmp_path.iterdir()))}", lambda e, m: None, options=options)

    run(32, 2**40)
    [first] = (cache / "torch-steps").iterdir()
    first_size = first.stat().st_size
    run(48, 3 * first_size // 2)  # room for one such step, not two: the first one goes
    [second] = (cache / "torch-steps").iterdir()
    again = run(32, 2**40)

    assert second != first and second.stat().st_size <= 3 * first_size // 2 < first_size + second.stat().st_size
    assert again.timings["compilations"] == 1  # its step was evicted: compiled again, and kept again
    assert len(list((cache / "torch-steps").iterdir())) == 2


def test_eviction_keeps_the_steps_used_last_and_the_one_just_saved(tmp_path):
    for age, name in enumerate(["old", "used", "new"]):
        (tmp_path / f"{name}.pt").write_bytes(b"x" * 10)
        os.utime(tmp_path / f"{name}.pt", (1000 + age, 1000 + age))
    os.utime(tmp_path / "old.pt", (2000, 2000))  # loaded since: used most recently
    removed = torch_step.evict_least_recent(tmp_path, 20, keep=tmp_path / "new.pt")
    assert removed == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["new.pt", "old.pt"]
    assert torch_step.evict_least_recent(tmp_path, 10, keep=tmp_path / "new.pt") == 1  # the one saved stays
    assert [p.name for p in tmp_path.iterdir()] == ["new.pt"]
    (tmp_path / "other.pt").write_bytes(b"x" * 4)
    (tmp_path / "huge.pt").write_bytes(b"x" * 50)  # alone over the bound: it goes, the rest stay
    assert torch_step.evict_least_recent(tmp_path, 20, keep=tmp_path / "huge.pt") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.pt", "other.pt"]
    # A copy being made is left alone; one a killed worker left an hour ago goes first.
    for name, mtime in ((".copying.pt2.7", time.time()), (".left.pt2.8", time.time() - 7200)):
        (tmp_path / name).write_bytes(b"x" * 10)
        os.utime(tmp_path / name, (mtime, mtime))
    assert torch_step.evict_least_recent(tmp_path, 14, keep=tmp_path / "new.pt") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".copying.pt2.7", "new.pt", "other.pt"]


def test_the_same_spec_on_data_with_other_classes_gets_its_own_step(tmp_path, fresh_dynamo):
    # Same spec, same features, another number of classes: another output layer, so the step
    # compiled for the first dataset must not be reused (its guards are no longer checked).
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 20)).astype(np.float32)

    def run(classes: int, name: str):
        y = x[:, :classes].argmax(axis=1).astype(np.int32)
        path = tmp_path / f"{classes}.safetensors"
        write(path, DatasetArrays(x[:320], y[:320], x[320:], y[320:], "classification", [str(c) for c in range(classes)], "npz"))
        info = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "task": "classification",
                "input_shape": [20], "num_classes": classes, "train_size": 320, "test_size": 80}
        spec = JobSpec(framework="pytorch", compile=True, epochs=2, batch_size=32,
                       dataset={"id": "ds_" + "0" * 32, "info": info})
        return fit(spec, tmp_path / name, lambda epoch, metrics: None, options=RunOptions(dataset_file=path))

    run(3, "three")
    after_three = run(5, "five")
    forget_compiled_steps()
    alone = run(5, "alone")

    assert after_three.timings["compilations"] == 1
    assert learned(after_three) == learned(alone)
    assert alone.result["test_accuracy"] > 0.5


def test_images_of_other_shapes_with_the_same_features_get_their_own_step(tmp_path, fresh_dynamo):
    # [6, 10, 3] and [10, 6, 3] images: the same flat features and, pooled, the same CNN
    # parameters; but the step reshapes its input to the image, so it is not shared.
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300).astype(np.int32)

    def run(shape: tuple[int, ...], name: str, cache_dir=None):
        x = rng.integers(0, 120, (300, *shape)).astype(np.uint8)
        x[np.arange(300), ..., y] += 100
        path = tmp_path / f"{name}.safetensors"
        write(path, DatasetArrays(x[:240], y[:240], x[240:], y[240:], "classification", ["r", "g", "b"], "npz"))
        info = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "task": "classification",
                "input_shape": list(shape), "num_classes": 3, "train_size": 240, "test_size": 60}
        spec = JobSpec(framework="pytorch", compile=True, epochs=2, batch_size=20,
                       dataset={"id": "ds_" + "0" * 32, "info": info},
                       model={"name": "cnn", "channels": [4], "hidden_sizes": [16]})
        return fit(spec, tmp_path / name, lambda e, m: None,
                   options=RunOptions(dataset_file=path, compile_cache_dir=cache_dir))

    rng_state = rng.bit_generator.state
    alone = run((10, 6, 3), "alone")
    forget_compiled_steps()
    run((6, 10, 3), "wide", tmp_path / "cache")
    rng.bit_generator.state = rng_state  # the tall data again, drawn the same
    after_wide = run((10, 6, 3), "tall", tmp_path / "cache")

    assert after_wide.timings["compilations"] == 1
    assert learned(after_wide) == learned(alone)
    assert len(list((tmp_path / "cache" / "torch-steps").iterdir())) == 2


def test_jobs_differing_in_learning_rate_share_the_compiled_step(tmp_path, digits_spec, fresh_dynamo):
    # The rate reaches the step as a tensor, so a sweep over it compiles once; each job still
    # trains as a freshly compiled one does.
    first = fit(digits_spec("pytorch", compile=True, epochs=2), tmp_path / "first", lambda e, m: None)
    other = digits_spec("pytorch", compile=True, epochs=2,
                        optimizer={"learning_rate": 0.003, "schedule": "warmup_cosine", "warmup_epochs": 1})
    shared = fit(other, tmp_path / "shared", lambda e, m: None)
    forget_compiled_steps()
    alone = fit(other, tmp_path / "alone", lambda e, m: None)

    assert first.timings["compilations"] == 1 and shared.timings["compilations"] == 0
    assert alone.timings["compilations"] == 1
    assert learned(shared) == learned(alone) != learned(first)
    assert [m.learning_rate for m in shared.metrics] == [m.learning_rate for m in alone.metrics]


def learned(result) -> list[tuple]:
    """Each epoch's losses and accuracies (not its times)."""
    return [(m.train_loss, m.train_accuracy, m.test_loss, m.test_accuracy) for m in result.metrics]


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
