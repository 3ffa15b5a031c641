"""User code in the trainers (in process, without the worker's sandbox): a flax module trained by
our jitted step with its own loss, resumed from a checkpoint, and the same MLP written in flax and
in torch starting from the same weights with init "shared" (the comparison's parity)."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest
from safetensors.numpy import load_file

from trainers import JobSpec, StopTraining, fit
from trainers.base import RunOptions
from trainers.user_code import load

CODE = textwrap.dedent('''
    import math

    import flax.linen as fnn
    import jax
    import optax
    import torch
    from torch import nn

    losses = []


    class FlaxMLP(fnn.Module):
        hidden: int
        classes: int

        @fnn.compact
        def __call__(self, x, train: bool = False):
            x = jax.nn.relu(fnn.Dense(self.hidden, name="hidden")(x))
            return fnn.Dense(self.classes, name="out")(x)


    class TorchMLP(nn.Module):
        def __init__(self, features, hidden, classes):
            super().__init__()
            self.hidden = nn.Linear(features, hidden)
            self.out = nn.Linear(hidden, classes)

        def forward(self, x):
            return self.out(torch.relu(self.hidden(x)))


    def flax_mlp(input_shape, num_classes, hidden=32):
        return FlaxMLP(hidden, num_classes)


    def torch_mlp(input_shape, num_classes, hidden=32):
        return TorchMLP(math.prod(input_shape), hidden, num_classes)


    class NoTrainFlag(fnn.Module):
        @fnn.compact
        def __call__(self, x):
            return fnn.Dense(10)(x)


    def plain(input_shape, num_classes):
        return NoTrainFlag()
''')

LOSS = textwrap.dedent('''
    import optax


    def loss(logits, targets):
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean() * 2.0
''')

SPEC = {"dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64, "optimizer": {"learning_rate": 0.01}}


def code_dir(tmp_path, name="model", extra=""):
    folder = tmp_path / f"code-{name}"
    folder.mkdir()
    (folder / f"{name}.py").write_text(CODE + extra)
    return folder


def train(spec: JobSpec, workdir, folder, report=lambda e, m: None):
    assert spec.model.entrypoint is not None
    user_model = load(folder, spec.model.entrypoint, spec.model.kwargs)
    return fit(spec, workdir, report, options=RunOptions(user_model=user_model))


def user_spec(framework: str, entrypoint: str, **model) -> JobSpec:
    code = {"code": "code_" + "0" * 32, "entrypoint": entrypoint, **model}
    return JobSpec(framework=framework, model=code, **SPEC)


def test_a_flax_module_trains_with_its_own_names_and_loss(tmp_path):
    trained = train(user_spec("jax", "model:flax_mlp", kwargs={"hidden": 24}), tmp_path / "run", code_dir(tmp_path))
    assert [m.epoch for m in trained.metrics] == [1, 2]
    assert trained.result["test_accuracy"] > 0.8
    weights = load_file(str(tmp_path / "run" / "weights.safetensors"))
    assert {n: w.shape for n, w in weights.items()} == {
        "hidden.weight": (24, 64), "hidden.bias": (24,), "out.weight": (10, 24), "out.bias": (10,)
    }
    assert {"params.msgpack", "weights.safetensors"} <= set(trained.artifacts)

    # A module-level loss replaces the task's: twice the cross-entropy doubles the first step's loss.
    doubled = train(
        user_spec("jax", "lossy:flax_mlp", kwargs={"hidden": 24}), tmp_path / "lossy", code_dir(tmp_path, "lossy", LOSS)
    )
    assert doubled.result["first_step_loss"] == pytest.approx(2 * trained.result["first_step_loss"], rel=1e-5)
    # A module whose __call__ takes no `train` flag is applied without one.
    assert train(user_spec("jax", "model:plain"), tmp_path / "plain", code_dir(tmp_path, "model2")).metrics


def test_a_flax_user_job_resumes_from_its_checkpoint(tmp_path):
    folder = code_dir(tmp_path)
    spec = JobSpec(framework="jax", model={"code": "code_" + "0" * 32, "entrypoint": "model:flax_mlp"},
                   **{**SPEC, "epochs": 3})
    whole = train(spec, tmp_path / "whole", folder)

    def stop_after_2(epoch, metrics):
        if epoch == 2:
            raise StopTraining("killed", "as if the worker died here")

    with pytest.raises(StopTraining):
        train(spec, tmp_path / "resumed", folder, stop_after_2)
    reported = []
    resumed = train(spec, tmp_path / "resumed", folder, lambda e, m: reported.append(e))
    assert reported == [1, 2, 3]
    assert resumed.metrics[-1].test_loss == pytest.approx(whole.metrics[-1].test_loss, abs=1e-6)


def test_shared_init_starts_a_flax_and_a_torch_module_from_the_same_weights(tmp_path):
    folder = code_dir(tmp_path)
    runs = {
        fw: train(user_spec(fw, entrypoint, init="shared"), tmp_path / fw, folder)
        for fw, entrypoint in (("jax", "model:flax_mlp"), ("pytorch", "model:torch_mlp"))
    }
    assert runs["jax"].result["first_step_loss"] == pytest.approx(runs["pytorch"].result["first_step_loss"], abs=1e-5)
    for a, b in zip(runs["jax"].metrics, runs["pytorch"].metrics, strict=True):
        assert a.train_loss == pytest.approx(b.train_loss, rel=0.02)
    weights = [load_file(str(tmp_path / fw / "weights.safetensors")) for fw in runs]
    assert {n: w.shape for n, w in weights[0].items()} == {n: w.shape for n, w in weights[1].items()}
    assert max(float(np.abs(weights[0][n] - weights[1][n]).max()) for n in weights[0]) < 0.05

    # Without it each framework draws its own initial weights.
    own = train(user_spec("jax", "model:flax_mlp"), tmp_path / "own", folder)
    assert own.result["first_step_loss"] != pytest.approx(runs["jax"].result["first_step_loss"], abs=1e-3)
