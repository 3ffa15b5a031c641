"""Both trainers on tiny data: learning, reporting, timings, artifacts, stopping, hardware."""

import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
import torch
from flax.serialization import msgpack_restore
from safetensors.numpy import load_file

from trainers import HardwareMismatch, StopTraining, fit
from trainers.data import load_dataset
from trainers.spec import DatasetSpec

FRAMEWORKS = ["jax", "pytorch"]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_learns_digits_and_reports_every_epoch(digits_runs, framework):
    run = digits_runs[framework]

    assert [epoch for epoch, _ in run.reported] == [1, 2, 3]
    assert [metrics for _, metrics in run.reported] == run.result.metrics
    assert run.result.result["test_accuracy"] > 0.9
    assert run.result.result["test_accuracy"] == run.result.metrics[-1].test_accuracy
    losses = [m.train_loss for m in run.result.metrics]
    assert losses == sorted(losses, reverse=True)
    assert all(isinstance(value, (int, float)) for value in run.result.metrics[-1].to_dict().values() if value is not None)
    assert run.result.metrics[-1].test_r2 is None  # a regression score, not a classifier's


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_timings(digits_runs, framework):
    timings = digits_runs[framework].result.timings
    epoch_times = [m.epoch_time_s for m in digits_runs[framework].result.metrics]

    assert timings["train_s"] == pytest.approx(sum(epoch_times))
    assert timings["first_epoch_s"] == epoch_times[0]
    assert timings["steady_epoch_s"] == pytest.approx(np.median(epoch_times[1:]))
    assert timings["setup_s"] > 0
    if framework == "jax":
        # 89 steps an epoch in two chunks of 45: the padded last chunk reuses the one program.
        assert timings["compilations"] == 1 and timings["compile_s"] > 0
    else:
        assert timings["compilations"] == 0 and timings["compile_s"] == 0


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_artifacts(digits_runs, framework):
    run = digits_runs[framework]
    own = {"jax": "params.msgpack", "pytorch": "state_dict.pt"}[framework]

    assert run.result.artifacts == ["weights.safetensors", "metrics.json", "spec.json", own]
    assert all((run.workdir / name).stat().st_size > 0 for name in run.result.artifacts)
    weights = load_file(run.workdir / "weights.safetensors")
    assert {name: w.shape for name, w in weights.items()} == {
        "layers.0.weight": (256, 64), "layers.0.bias": (256,),
        "layers.1.weight": (128, 256), "layers.1.bias": (128,),
        "layers.2.weight": (10, 128), "layers.2.bias": (10,),
    }
    assert run.result.device["devices"] == ["cpu:0"] and run.result.device["backend"] == "cpu"


def test_state_dict_loads_with_weights_only(digits_runs):
    run = digits_runs["pytorch"]
    state_dict = torch.load(run.workdir / "state_dict.pt", weights_only=True)
    weights = load_file(run.workdir / "weights.safetensors")
    assert set(state_dict) == set(weights)
    for name, tensor in state_dict.items():
        np.testing.assert_array_equal(tensor.numpy(), weights[name])


def test_params_msgpack_matches_the_weights(digits_runs):
    run = digits_runs["jax"]
    variables = msgpack_restore((run.workdir / "params.msgpack").read_bytes())
    weights = load_file(run.workdir / "weights.safetensors")
    assert set(variables) == {"params"}  # laid out as model.init returns them
    np.testing.assert_array_equal(variables["params"]["layers_1"]["kernel"], weights["layers.1.weight"].T)


def test_jax_weights_load_into_pytorch(digits_runs):
    from trainers import torch_models

    run = digits_runs["jax"]
    digits = load_dataset(DatasetSpec(name="digits"))
    model = torch_models.load_weights(run.workdir / "weights.safetensors")
    _, accuracy = torch_models.evaluate(model, digits.x_test, digits.y_test)
    assert accuracy == pytest.approx(run.result.result["test_accuracy"], abs=0.001)


def test_pytorch_weights_load_into_jax(digits_runs):
    from trainers import jax_models

    run = digits_runs["pytorch"]
    digits = load_dataset(DatasetSpec(name="digits"))
    model, params = jax_models.load_weights(run.workdir / "weights.safetensors")
    _, accuracy = jax_models.evaluate(model, params, digits.x_test, digits.y_test)
    assert accuracy == pytest.approx(run.result.result["test_accuracy"], abs=0.001)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_stop_training_keeps_the_epochs_reported_so_far(tmp_path, digits_spec, framework):
    reported = []

    def should_stop():
        if reported:  # the first check of epoch 2
            raise StopTraining("cancelled")

    with pytest.raises(StopTraining) as raised:
        fit(digits_spec(framework, epochs=5), tmp_path, lambda epoch, m: reported.append(epoch), should_stop)

    assert raised.value.reason == "cancelled"
    assert reported == [1]
    assert not (tmp_path / "weights.safetensors").exists()


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_dropout_trains(tmp_path, digits_spec, train, framework):
    run = train(digits_spec(framework, epochs=1, batch_size=64, model={"dropout": 0.3}), tmp_path)
    assert run.result.metrics[0].train_accuracy > 0.3
    assert run.result.result["test_accuracy"] > 0.5


def test_jax_refuses_a_gpu_job_without_a_gpu(tmp_path, digits_spec):
    if jax.default_backend() == "gpu":
        pytest.skip("this machine has a GPU")
    with pytest.raises(HardwareMismatch, match="gpu"):
        fit(digits_spec("jax", hardware="gpu"), tmp_path, lambda *_: None)


def test_pytorch_refuses_a_gpu_job_without_a_gpu(tmp_path, digits_spec):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(HardwareMismatch, match="gpu"):
        fit(digits_spec("pytorch", hardware="gpu"), tmp_path, lambda *_: None)


def test_jax_chunks_pad_the_last_one_with_masked_steps():
    from trainers.common import epoch_batches
    from trainers.jax_trainer import _chunk, _chunk_steps

    assert [_chunk_steps(steps) for steps in (11, 50, 51, 89, 468)] == [11, 50, 26, 45, 47]

    batches = epoch_batches(0, 1, n=1437, batch_size=16)  # 89 steps
    chunks = [_chunk(batches, first, 50, 50) for first in (0, 50)]

    assert [batch_idx.shape for batch_idx, _, _ in chunks] == [(50, 16), (50, 16)]
    assert [int(valid.sum()) for _, _, valid in chunks] == [50, 39]
    ran = np.concatenate([batch_idx[valid] for batch_idx, _, valid in chunks])
    np.testing.assert_array_equal(ran, batches)
    np.testing.assert_array_equal(np.concatenate([ids for _, ids, _ in chunks])[:89], np.arange(89))


def test_jax_slow_steps_run_fewer_per_call():
    from trainers.jax_trainer import CHUNK_TARGET_S, steps_per_chunk

    assert steps_per_chunk(0.001, 50) == 50  # the MLP: a whole chunk in 50 ms
    assert steps_per_chunk(CHUNK_TARGET_S / 10, 50) == 10
    assert steps_per_chunk(CHUNK_TARGET_S * 60, 50) == 1  # a minute a step: one per call


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_fast_steps_ask_should_stop_once_per_chunk(tmp_path, digits_spec, monkeypatch, framework):
    # Steps count as fast however loaded the machine is (no timed looks in between).
    from trainers import jax_trainer, torch_trainer

    monkeypatch.setattr(jax_trainer, "CHUNK_TARGET_S", 1e9)
    monkeypatch.setattr(torch_trainer, "STOP_CHECK_S", 1e9)
    reported, asked_in_epoch = [], []
    fit(digits_spec(framework, epochs=2), tmp_path, lambda epoch, m: reported.append(epoch),
        lambda: asked_in_epoch.append(len(reported) + 1))
    # Epoch 2's 89 steps: two calls of 45 steps (JAX), or steps 0 and 50 (PyTorch). (JAX's epoch 1
    # also runs its first two steps one by one, to time them.)
    assert asked_in_epoch.count(2) == 2


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_slow_steps_ask_should_stop_after_every_step(tmp_path, digits_spec, monkeypatch, framework):
    # A large model's steps take seconds: a cancel must not wait for a whole chunk of them.
    # Here every step counts as slow (its budget is a nanosecond), so a cancel is seen after
    # the step it came in.
    from trainers import jax_trainer, torch_trainer

    monkeypatch.setattr(jax_trainer, "CHUNK_TARGET_S", 1e-9)
    monkeypatch.setattr(torch_trainer, "STOP_CHECK_S", 0.0)
    calls = []

    def should_stop():
        calls.append(1)
        if len(calls) == 3:
            raise StopTraining("cancelled")

    spec = digits_spec(framework, epochs=1)
    with pytest.raises(StopTraining):
        fit(spec, tmp_path, lambda *_: None, should_stop)
    assert len(calls) == 3  # steps 0 and 1 ran, and the cancel came before step 2 (no chunk of steps ran)

    calls.clear()
    run = fit(spec, tmp_path / "whole", lambda *_: None, lambda: calls.append(1))
    assert len(calls) == 1437 // spec.batch_size  # asked before every one of the epoch's 89 steps
    assert run.timings["compilations"] == (1 if framework == "jax" else 0)


def test_jax_persistent_compilation_cache(tmp_path):
    # In a child process: the cache directory is process-wide jax configuration.
    code = (
        "import sys, tempfile; from pathlib import Path; from trainers import JobSpec, RunOptions, fit\n"
        "spec = JobSpec(framework='jax', dataset={'name': 'digits'}, epochs=1)\n"
        "options = RunOptions(compile_cache_dir=Path(sys.argv[1]))\n"
        "for _ in range(2):\n"
        "    result = fit(spec, Path(tempfile.mkdtemp()), lambda *_: None, options=options)\n"
        "    assert result.timings['compilations'] == 1, result.timings\n"
    )
    subprocess.run([sys.executable, "-c", code, str(tmp_path / "cache")], check=True, cwd=Path(__file__).parents[2])
    assert any(name.startswith("jit_train_chunk") for name in os.listdir(tmp_path / "cache"))


def test_the_jax_compile_cache_keeps_within_its_bound_dropping_the_least_recently_used(tmp_path):
    # A year of jobs of many shapes: JAX's persistent cache stays within compile_cache_max_bytes.
    code = (
        "import sys, tempfile; from pathlib import Path; from trainers import JobSpec, RunOptions, fit\n"
        "options = RunOptions(compile_cache_dir=Path(sys.argv[1]), compile_cache_max_bytes=int(sys.argv[2]))\n"
        "for hidden in sys.argv[3:]:\n"
        "    spec = JobSpec(framework='jax', dataset={'name': 'digits'}, epochs=1, model={'hidden_sizes': [int(hidden)]})\n"
        "    fit(spec, Path(tempfile.mkdtemp()), lambda *_: None, options=options)\n"
    )

    def programs(*hidden: int, cache: Path, max_bytes: int = 2**40) -> dict[str, int]:
        subprocess.run([sys.executable, "-c", code, str(cache), str(max_bytes), *map(str, hidden)], check=True,
                       cwd=Path(__file__).parents[2])
        return {p.name: p.stat().st_size for p in cache.iterdir() if p.name.endswith("-cache")}

    alone = programs(32, cache=tmp_path / "alone")
    bound = 3 * sum(alone.values()) // 2  # room for one model's programs, not two
    kept = programs(32, 48, cache=tmp_path / "bounded", max_bytes=bound)
    assert sum(kept.values()) <= bound
    assert set(alone) - set(kept)  # some of the first model's programs went...
    assert set(kept) - set(alone)  # ...the second's stayed

    # A cache an unbounded worker (an older version) filled keeps taking programs once bounded.
    legacy = programs(32, cache=tmp_path / "legacy", max_bytes=-1)
    assert set(programs(48, cache=tmp_path / "legacy")) > set(legacy)


def test_evaluation_in_batches_matches_the_whole_set_at_once(digits_runs, monkeypatch):
    # The test set is evaluated EVAL_BATCH examples at a time (a wide CNN cannot hold the
    # activations of 10,000 at once): a batch size that leaves a ragged last batch changes nothing.
    from trainers import jax_models, torch_models

    digits = load_dataset(DatasetSpec(name="digits"))  # 360 test examples
    model, params = jax_models.load_weights(digits_runs["jax"].workdir / "weights.safetensors")
    torch_model = torch_models.load_weights(digits_runs["pytorch"].workdir / "weights.safetensors")
    whole = jax_models.evaluate(model, params, digits.x_test, digits.y_test)
    torch_whole = torch_models.evaluate(torch_model, digits.x_test, digits.y_test)
    assert whole[1] == pytest.approx(digits_runs["jax"].result.result["test_accuracy"], abs=1e-6)
    assert torch_whole[1] == pytest.approx(digits_runs["pytorch"].result.result["test_accuracy"], abs=1e-6)
    monkeypatch.setattr(jax_models, "EVAL_BATCH", 7)
    monkeypatch.setattr(torch_models, "EVAL_BATCH", 7)
    # (not jitted: a jitted evaluate could reuse the program traced with the first batch size)
    batched = jax_models.eval_metrics(model, params, digits.x_test, digits.y_test)
    assert [float(v) for v in batched] == pytest.approx(whole, rel=1e-5)
    assert torch_models.evaluate(torch_model, digits.x_test, digits.y_test) == pytest.approx(torch_whole, rel=1e-5)
