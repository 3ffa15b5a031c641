"""Issue 9: the CNN, batch norm, optimizers, schedules, clipping, DP-SGD and precision, in both
frameworks with the same meaning, on tiny data."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
import torch
from pydantic import ValidationError
from safetensors.numpy import load_file

from trainers import JobSpec, fit, jax_models, torch_models
from trainers.common import forward, init_weights, learning_rate_at
from trainers.data import load_dataset
from trainers.spec import DatasetSpec, ModelSpec, OptimizerSpec, parameter_count

FRAMEWORKS = ["jax", "pytorch"]
DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")

# 1437 digits as 8x8x1 images, 44 steps of 32: conv 8 -> pool 4x4 -> conv 16 -> pool 2x2 -> 64 -> 32 -> 10.
CNN_DIGITS = {"dataset": {"name": "digits"}, "batch_size": 32, "epochs": 3, "seed": 0,
              "optimizer": {"learning_rate": 0.005},
              "model": {"name": "cnn", "channels": [8, 16], "hidden_sizes": [32]}}
# A small MLP on 512 digits: 8 steps of 64 an epoch.
SMALL = {"dataset": {"name": "digits", "train_limit": 512}, "batch_size": 64, "epochs": 1, "seed": 1,
         "model": {"hidden_sizes": [32]}}


def _fit(framework: str, workdir: Path, **spec):
    return fit(JobSpec(framework=framework, **spec), workdir, lambda epoch, metrics: None)


@pytest.fixture(scope="module")
def cnn_runs(tmp_path_factory):
    return {fw: (_fit(fw, d := tmp_path_factory.mktemp(f"cnn-{fw}"), **CNN_DIGITS), d) for fw in FRAMEWORKS}


# --- models -------------------------------------------------------------------------------------

@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_cnn_learns_digits(cnn_runs, framework):
    result, workdir = cnn_runs[framework]
    assert result.result["test_accuracy"] > 0.85
    shapes = {name: w.shape for name, w in load_file(workdir / "weights.safetensors").items()}
    assert shapes == {"convs.0.weight": (8, 1, 3, 3), "convs.0.bias": (8,), "convs.1.weight": (16, 8, 3, 3),
                      "convs.1.bias": (16,), "layers.0.weight": (32, 64), "layers.0.bias": (32,),
                      "layers.1.weight": (10, 32), "layers.1.bias": (10,)}
    if framework == "jax":
        assert result.timings["compilations"] == 1


def test_cnn_trains_the_same_in_both_frameworks(cnn_runs):
    jax_result, torch_result = cnn_runs["jax"][0], cnn_runs["pytorch"][0]
    assert jax_result.result["first_step_loss"] == pytest.approx(torch_result.result["first_step_loss"], abs=1e-5)
    for a, b in zip(jax_result.metrics, torch_result.metrics):
        assert a.train_loss == pytest.approx(b.train_loss, rel=0.02)


@pytest.mark.parametrize("trained_by", FRAMEWORKS)
def test_cnn_weights_cross_load_with_matching_logits(cnn_runs, trained_by):
    path = cnn_runs[trained_by][1] / "weights.safetensors"
    x = load_dataset(DatasetSpec(name="digits", test_limit=100)).x_test
    jax_model, variables = jax_models.load_weights(path)
    jax_logits = np.asarray(jax_model.apply(variables, x))
    torch_logits = torch_models.load_weights(path, input_shape=64)(torch.tensor(x)).detach().numpy()
    np.testing.assert_allclose(jax_logits, torch_logits, atol=1e-4)
    np.testing.assert_allclose(forward(load_file(path), x), torch_logits, atol=1e-4)


def test_conv_kernels_are_hwio_in_flax_and_oihw_in_the_file():
    weights = init_weights(ModelSpec(name="cnn", channels=[4, 8], hidden_sizes=[16]), 64, 10, seed=0)
    params = jax_models.params_from_weights(weights)
    assert params["convs_1"]["kernel"].shape == (3, 3, 4, 8)
    np.testing.assert_array_equal(params["convs_1"]["kernel"][1, 2, 3, 5], weights["convs.1.weight"][5, 3, 1, 2])
    back = jax_models.weights_from_params(params)
    assert list(back) == list(weights) and all(np.array_equal(back[k], weights[k]) for k in weights)


@pytest.mark.skipif(not DEBIAN_FASHION.is_dir(), reason="needs Debian's dataset-fashion-mnist")
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_cnn_learns_a_fashion_mnist_slice(tmp_path, framework, monkeypatch):
    monkeypatch.delenv("TRAINHUB_DATA_DIR", raising=False)
    result = _fit(framework, tmp_path, dataset={"name": "fashion-mnist", "train_limit": 1024, "test_limit": 256},
                  model={"name": "cnn", "channels": [4, 8], "hidden_sizes": [32]}, batch_size=64, epochs=2)
    assert result.result["test_accuracy"] > 0.6  # chance is 0.1


@pytest.mark.parametrize("model", [{"hidden_sizes": [32], "batch_norm": True},
                                   {"name": "cnn", "channels": [4], "hidden_sizes": [16], "batch_norm": True}])
def test_batch_norm_trains_the_same_and_saves_running_stats(tmp_path, model):
    runs = {fw: _fit(fw, tmp_path / fw, **{**SMALL, "model": model, "epochs": 2}) for fw in FRAMEWORKS}
    assert runs["jax"].result["first_step_loss"] == pytest.approx(runs["pytorch"].result["first_step_loss"], abs=1e-5)
    for a, b in zip(runs["jax"].metrics, runs["pytorch"].metrics):
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-3)
        assert a.test_loss == pytest.approx(b.test_loss, rel=1e-3)  # eval uses the running stats
    jax_w, torch_w = (load_file(tmp_path / fw / "weights.safetensors") for fw in FRAMEWORKS)
    assert jax_w.keys() == torch_w.keys()
    stats = [name for name in jax_w if "running" in name]
    assert stats and all(not np.allclose(jax_w[n], 0.0 if "mean" in n else 1.0) for n in stats)
    for name in stats:
        if name.endswith("running_var"):
            np.testing.assert_allclose(jax_w[name], torch_w[name], rtol=1e-2)
        else:
            # The bias before a batch norm has a zero gradient but for rounding, which Adam scales
            # up to full steps that differ between frameworks; the norm cancels it, and so does
            # subtracting it from the running mean (up to the bias's drift within the average).
            group, index = name.split(".")[:2]
            bias = f"{'convs' if group == 'conv_norms' else 'layers'}.{index}.bias"
            np.testing.assert_allclose(jax_w[name] - jax_w[bias], torch_w[name] - torch_w[bias], atol=1e-2)


# --- optimizers, schedules, clipping ---------------------------------------------------------------

@pytest.mark.parametrize("optimizer", [
    {"name": "adam", "weight_decay": 0.01},
    {"name": "adamw", "weight_decay": 0.05},
    {"name": "sgd", "learning_rate": 0.05, "momentum": 0.9, "nesterov": True, "weight_decay": 1e-3},
    {"name": "sgd", "learning_rate": 0.1},
    {"name": "adam", "clip_norm": 0.5},
])
def test_optimizers_mean_the_same_in_both_frameworks(tmp_path, optimizer):
    runs = {fw: _fit(fw, tmp_path / fw, **{**SMALL, "optimizer": optimizer, "epochs": 2}) for fw in FRAMEWORKS}
    for a, b in zip(runs["jax"].metrics, runs["pytorch"].metrics):
        assert a.train_loss == pytest.approx(b.train_loss, rel=1e-3)
    jax_w, torch_w = (load_file(tmp_path / fw / "weights.safetensors") for fw in FRAMEWORKS)
    for name in jax_w:
        np.testing.assert_allclose(jax_w[name], torch_w[name], atol=2e-4)


@pytest.mark.parametrize("schedule,warmup,expected", [
    ("constant", 0, [0.01] * 4),
    ("cosine", 0, [0.01 * (1 + math.cos(math.pi * e / 4)) / 2 for e in range(4)]),  # 0.01, .0085, .005, .0015
    ("warmup_cosine", 1, [0.0] + [0.01 * (1 + math.cos(math.pi * e / 3)) / 2 for e in range(3)]),
])
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_schedules_give_the_expected_learning_rate_per_epoch(tmp_path, framework, schedule, warmup, expected):
    optimizer = {"name": "sgd", "learning_rate": 0.01, "schedule": schedule, "warmup_epochs": warmup}
    result = _fit(framework, tmp_path, **{**SMALL, "optimizer": optimizer, "epochs": 4})
    rates = [m.learning_rate for m in result.metrics]
    assert rates == pytest.approx(expected, abs=1e-7)
    spec = OptimizerSpec(**optimizer)
    assert rates == pytest.approx([learning_rate_at(spec, e * 8, 8, 4) for e in range(4)], abs=1e-7)
    assert json.loads((tmp_path / "metrics.json").read_text())[1]["learning_rate"] == pytest.approx(expected[1])


def test_schedules_step_per_step_in_both_frameworks():
    """Within an epoch too: optax's schedule and the torch scheduler agree with the formula per step."""
    from trainers.jax_trainer import make_optimizer as jax_optimizer
    from trainers.torch_trainer import make_optimizer as torch_optimizer

    spec = JobSpec(framework="jax", **{**SMALL, "epochs": 3,
                                       "optimizer": {"schedule": "warmup_cosine", "warmup_epochs": 1}})
    _, jax_rate = jax_optimizer(spec, 8)
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = torch_optimizer(spec, model, torch.device("cpu"), 8)
    for step in range(24):
        expected = learning_rate_at(spec.optimizer, step, 8, 3)
        assert jax_rate(step) == pytest.approx(expected, abs=1e-9)
        assert optimizer.param_groups[0]["lr"] == pytest.approx(expected, abs=1e-9)
        optimizer.step()
        scheduler.step()


@pytest.mark.parametrize("framework", FRAMEWORKS)
@pytest.mark.parametrize("privacy", [None, {"clip_norm": 0.02, "noise_multiplier": 0.0}])
def test_clipping_bounds_the_update(tmp_path, framework, privacy):
    """One SGD step of rate 1: the params move by at most clip_norm (global clipping), or by at
    most the per-example bound (DP-SGD: a mean of vectors of norm <= C)."""
    clip = 0.01
    spec = {**SMALL, "dataset": {"name": "digits", "train_limit": 64}, "privacy": privacy,
            "optimizer": {"name": "sgd", "learning_rate": 1.0, "clip_norm": None if privacy else clip}}
    _fit(framework, tmp_path, **spec)
    before = init_weights(ModelSpec(hidden_sizes=[32]), 64, 10, seed=1)
    after = load_file(tmp_path / "weights.safetensors")
    moved = math.sqrt(sum(float(np.sum((after[k] - before[k]) ** 2)) for k in before))
    if privacy:  # the mean of per-example gradients clipped to C: at most C, less as they disagree
        assert 0 < moved <= privacy["clip_norm"] * (1 + 1e-4)
    else:  # the batch gradient's norm is far above clip_norm: the step is exactly clip_norm long
        assert moved == pytest.approx(clip, rel=1e-4)


def test_optax_and_torch_clip_the_same_way():
    grads = {"w": np.full((3, 4), 2.0, np.float32)}  # global norm 2 * sqrt(12)
    clipped, _ = optax.clip_by_global_norm(1.0).update(grads, None)
    tensor = torch.nn.Parameter(torch.zeros(3, 4))
    tensor.grad = torch.full((3, 4), 2.0)
    torch.nn.utils.clip_grad_norm_([tensor], 1.0)
    np.testing.assert_allclose(np.asarray(clipped["w"]), tensor.grad.numpy(), rtol=1e-5)


# --- per-example gradients (DP-SGD) -----------------------------------------------------------------

def test_private_training_without_noise_is_the_same_in_both_frameworks(tmp_path):
    privacy = {"clip_norm": 1.0, "noise_multiplier": 0.0}
    runs = {fw: _fit(fw, tmp_path / fw, **{**SMALL, "privacy": privacy}) for fw in FRAMEWORKS}
    assert runs["jax"].metrics[0].train_loss == pytest.approx(runs["pytorch"].metrics[0].train_loss, rel=1e-4)
    jax_w, torch_w = (load_file(tmp_path / fw / "weights.safetensors") for fw in FRAMEWORKS)
    for name in jax_w:
        np.testing.assert_allclose(jax_w[name], torch_w[name], atol=1e-5)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_private_training_with_noise_learns_and_records_its_settings(tmp_path, framework):
    privacy = {"clip_norm": 1.0, "noise_multiplier": 0.5}
    result = _fit(framework, tmp_path, **{**SMALL, "privacy": privacy, "epochs": 3,
                                          "optimizer": {"learning_rate": 0.01}})
    assert result.result["test_accuracy"] > 0.5
    assert json.loads((tmp_path / "spec.json").read_text())["privacy"] == privacy
    clean = _fit(framework, tmp_path / "clean", **{**SMALL, "privacy": {**privacy, "noise_multiplier": 0.0},
                                                   "epochs": 3, "optimizer": {"learning_rate": 0.01}})
    assert clean.metrics[-1].train_loss != result.metrics[-1].train_loss  # the noise was added


# --- spec ---------------------------------------------------------------------------------------

def test_defaults_serialise_as_before():
    spec = JobSpec(framework="jax")
    assert spec.model_dump()["model"] == {"name": "mlp", "hidden_sizes": [256, 128], "dropout": 0.0}
    assert spec.model_dump()["optimizer"] == {"name": "adam", "learning_rate": 0.001}
    assert {"privacy", "precision", "devices"}.isdisjoint(spec.model_dump())


@pytest.mark.parametrize("body,message", [
    ({"hardware": "cpu", "precision": "bf16"}, "needs hardware gpu or tpu"),
    ({"model": {"channels": [8]}}, "channels is for model cnn only"),
    ({"model": {"name": "cnn", "channels": [8, 8, 8, 8]}, "dataset": {"name": "digits"}}, "fewer conv layers"),
    ({"optimizer": {"name": "adam", "momentum": 0.9}}, "momentum and nesterov are for optimizer sgd"),
    ({"optimizer": {"name": "sgd", "nesterov": True}}, "nesterov needs a momentum"),
    ({"optimizer": {"schedule": "warmup_cosine", "warmup_epochs": 10}}, "warmup_epochs"),
    ({"privacy": {}, "model": {"batch_norm": True}}, "turn model.batch_norm off"),
    ({"devices": 3, "batch_size": 128}, "multiple of devices"),
])
def test_spec_refuses_options_that_do_not_fit(body, message):
    with pytest.raises(ValidationError, match=message):
        JobSpec(framework="jax", **body)


def test_bf16_is_accepted_on_accelerators_and_parameter_count_covers_the_cnn():
    assert JobSpec(framework="pytorch", hardware="gpu", precision="bf16").precision == "bf16"
    spec = JobSpec(framework="jax", **CNN_DIGITS)
    weights = init_weights(spec.model, 64, 10, 0)
    assert parameter_count(spec) == sum(w.size for w in weights.values())


def test_bf16_models_compute_in_bfloat16_with_float32_params():
    """What precision "bf16" runs on gpu/tpu, checked here on the CPU at the model level."""
    x = load_dataset(DatasetSpec(name="digits", test_limit=64)).x_test
    weights = init_weights(ModelSpec(name="cnn", channels=[4], hidden_sizes=[16]), 64, 10, 0)
    model = jax_models.build(ModelSpec(name="cnn", channels=[4], hidden_sizes=[16]), 10, jax.numpy.bfloat16)
    params = jax_models.params_from_weights(weights)
    logits = model.apply({"params": params}, x)
    assert logits.dtype == np.float32
    np.testing.assert_allclose(np.asarray(logits), forward(weights, x), atol=0.1)
    torch_model = torch_models.from_weights(weights, input_shape=64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        torch_logits = torch_model(torch.tensor(x))
    assert torch_logits.dtype == torch.bfloat16 and torch_model.layers[0].weight.dtype == torch.float32
    np.testing.assert_allclose(torch_logits.float().detach().numpy(), forward(weights, x), atol=0.1)


@pytest.mark.parametrize(
    "channels, kernel, strides, padding, use_bias",
    [(3, 3, 1, "SAME", True), (4, 3, 1, "SAME", True), (5, 3, 1, "VALID", False), (3, 2, 1, "SAME", True),
     (3, 5, 1, "SAME", False), (3, 1, 1, "VALID", True), (3, 3, 2, "VALID", True)],
)
def test_the_cpu_convolution_is_nn_conv_with_the_same_params_and_gradients(channels, kernel, strides, padding, use_bias):
    """CpuConv (what a JAX model uses on the CPU: its own gradient at stride 1, its forward pass
    one matmul with 3 channels or fewer, im2col above stride 1) against flax's nn.Conv: values,
    and the gradients of the input, kernel and bias."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp

    from trainers.jax_conv import CpuConv

    x = jax.random.normal(jax.random.PRNGKey(0), (4, 7, 9, channels))
    conv = nn.Conv(5, (kernel, kernel), (strides, strides), padding=padding, use_bias=use_bias)
    params = conv.init(jax.random.PRNGKey(1), x)
    params = jax.tree.map(lambda p: p + 0.1, params)  # a nonzero bias too
    ours = CpuConv(5, kernel, strides, padding, use_bias=use_bias)
    assert jax.tree.map(jnp.shape, ours.init(jax.random.PRNGKey(2), x)) == jax.tree.map(jnp.shape, params)

    def loss(module):
        return lambda p, x: jnp.sum(jnp.sin(module.apply(p, x)))

    np.testing.assert_allclose(ours.apply(params, x), conv.apply(params, x), rtol=1e-5, atol=1e-5)
    got, want = jax.grad(loss(ours), argnums=(0, 1))(params, x), jax.grad(loss(conv), argnums=(0, 1))(params, x)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    # In bfloat16 (mixed precision): the same within bfloat16's precision, parameters' gradients float32.
    ours16 = CpuConv(5, kernel, strides, padding, use_bias=use_bias, dtype=jnp.bfloat16)
    got16 = jax.grad(loss(ours16))(params, x)
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(got16))
    for g, w in zip(jax.tree.leaves(got16), jax.tree.leaves(want[0])):
        np.testing.assert_allclose(g, w, rtol=0.05, atol=0.05 * float(jnp.max(jnp.abs(w))))
