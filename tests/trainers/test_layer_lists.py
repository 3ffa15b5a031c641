"""Layer lists, drawn at random (hypothesis): every valid list builds the same model in numpy, JAX
and PyTorch from the same seed (the same outputs and the same first-step loss, to 1e-5), and every
invalid one is refused naming the right layer."""

from __future__ import annotations

import numpy as np
import optax
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from trainers import jax_models, reference, torch_models
from trainers.jax_conv import tiled_pool
from trainers.layers import Layer, LayerError, plan
from trainers.spec import JobSpec

LAYERS = TypeAdapter(list[Layer])
OUTPUTS = 3
BATCH = 6
ACTS = ["relu", "gelu", "tanh", "sigmoid", "silu"]


@st.composite
def image_block(draw: st.DrawFn, size: list[int]) -> list[dict]:
    """One spatial layer (or a residual of them) that fits an image of `size` = [H, W] (updated)."""
    kind = draw(st.sampled_from(["conv_same", "conv_valid", "pool", "norm", "act", "residual"]))
    if kind == "conv_same":
        return [{"type": "conv2d", "filters": draw(st.integers(1, 4)), "kernel_size": draw(st.sampled_from([1, 3])),
                 "use_bias": draw(st.booleans())}]
    if kind == "conv_valid" and min(size) >= 3:
        k, s = draw(st.sampled_from([2, 3])), draw(st.sampled_from([1, 2]))
        size[:] = [(n - k) // s + 1 for n in size]
        return [{"type": "conv2d", "filters": draw(st.integers(1, 4)), "kernel_size": k, "strides": s,
                 "padding": "valid"}]
    if kind == "pool" and min(size) >= 2:
        size[:] = [n // 2 for n in size]
        return [{"type": draw(st.sampled_from(["max_pool", "avg_pool"])), "window": 2}]
    if kind == "norm":
        return norm(draw, {"type": "conv2d", "filters": draw(st.integers(4, 6)), "kernel_size": 3})
    if kind == "residual":
        inner = [{"type": "conv2d", "filters": draw(st.integers(1, 4)), "kernel_size": 3},
                 {"type": draw(st.sampled_from(["batch_norm", *ACTS]))}]
        return [{"type": "residual", "layers": inner}]
    return [{"type": draw(st.sampled_from(ACTS))}]


def norm(draw: st.DrawFn, widening: dict) -> list[dict]:
    """A batch norm, or a layer norm after a layer at least 4 wide: over fewer values, a layer
    norm's variance is near 0 often enough to amplify float32 rounding past any tolerance (in
    every library alike: it is the numbers, not the code)."""
    if draw(st.booleans()):
        return [{"type": "batch_norm"}]
    return [widening, {"type": "layer_norm"}]


@st.composite
def dense_block(draw: st.DrawFn) -> list[dict]:
    kind = draw(st.sampled_from(["dense", "norm", "act", "residual"]))
    if kind == "dense":
        return [{"type": "dense", "units": draw(st.integers(1, 8)), "use_bias": draw(st.booleans())}]
    if kind == "norm":
        return norm(draw, {"type": "dense", "units": draw(st.integers(4, 8))})
    if kind == "residual":
        return [{"type": "residual", "layers": [{"type": "dense", "units": draw(st.integers(1, 8))},
                                                {"type": draw(st.sampled_from(ACTS))}]}]
    return [{"type": draw(st.sampled_from(ACTS))}]


@st.composite
def models(draw: st.DrawFn) -> tuple[list[dict], tuple[int, ...]]:
    """(a valid layer list ending in OUTPUTS units, the input shape it is for)."""
    layers: list[dict] = []
    if draw(st.booleans()):
        size = [draw(st.integers(4, 8)), draw(st.integers(4, 8))]
        shape: tuple[int, ...] = (*size, draw(st.integers(1, 3)))
        for _ in range(draw(st.integers(1, 4))):
            layers += draw(image_block(size))
        layers.append({"type": draw(st.sampled_from(["flatten", "global_avg_pool"]))})
    else:
        shape = (draw(st.integers(2, 10)),)
    for _ in range(draw(st.integers(0, 3))):
        layers += draw(dense_block())
    return [*layers, {"type": "dense", "units": OUTPUTS}], shape


def build_all(layers: list[dict], shape: tuple[int, ...], seed: int = 0) -> tuple:
    walked = plan(LAYERS.validate_python(layers), shape, OUTPUTS)
    weights = reference.init(walked, seed)
    torch_model = torch_models.LayerModel(walked.ops, walked.input_shape)
    torch_model.load_state_dict({k: torch.tensor(v) for k, v in weights.items()}, strict=False)
    jax_model = jax_models.LayerModel(walked.ops, walked.input_shape, conv_as_matmul=True)
    variables = jax_models.variables_from_weights(weights)
    return walked, weights, torch_model, jax_model, variables


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(models(), st.integers(0, 2**31 - 1))
def test_a_valid_list_is_the_same_model_in_numpy_jax_and_pytorch(model, seed):
    layers, shape = model
    walked, weights, torch_model, jax_model, variables = build_all(layers, shape, seed % 1000)
    x = np.random.default_rng(seed).standard_normal((BATCH, int(np.prod(shape))), dtype=np.float32)
    y = np.arange(BATCH) % OUTPUTS
    # Eval mode: the outputs agree.
    expected = reference.forward(walked, weights, x)
    with torch.no_grad():
        torch_out = torch_model.eval()(torch.tensor(x)).numpy()
    jax_out = np.asarray(jax_model.apply(variables, x, train=False))
    # To 1e-5 of the outputs' scale: float32 rounding, summed in other orders by each library.
    tolerance = 1e-5 * max(1.0, float(np.abs(expected).max()))
    assert np.abs(torch_out - expected).max() <= tolerance
    assert np.abs(jax_out - expected).max() <= tolerance
    # Train mode (batch statistics): the first step's loss agrees.
    torch_loss = F.cross_entropy(torch_model.train()(torch.tensor(x)), torch.tensor(y)).item()
    logits, _ = jax_model.apply(variables, x, train=True, mutable=["batch_stats"], rngs={"dropout": np.zeros(2, np.uint32)})
    jax_loss = float(optax.softmax_cross_entropy_with_integer_labels(logits, y).mean())
    # (batch statistics are float32 sums over the batch in each library's order: seen 1.6e-5 apart)
    assert abs(torch_loss - jax_loss) <= 5e-5 * max(1.0, abs(torch_loss))
    # The weights survive a round trip through either framework's layout.
    back = jax_models.weights_from_params(variables["params"], variables.get("batch_stats"), list(weights))
    assert list(back) == list(weights) and all(np.array_equal(back[k], weights[k]) for k in weights)


INVALID = [
    ([{"type": "flatten"}, {"type": "conv2d", "filters": 2}, {"type": "dense", "units": 10}], "model.layers[1] (conv2d)",
     "needs an image"),
    ([{"type": "max_pool", "window": 4}, {"type": "max_pool", "window": 8}, {"type": "flatten"},
      {"type": "dense", "units": 10}], "model.layers[1] (max_pool)", "larger than the 7x7 image"),
    ([{"type": "conv2d", "filters": 2}, {"type": "dense", "units": 10}], "model.layers[1] (dense)",
     "needs a flat input"),
    ([{"type": "residual", "layers": [{"type": "max_pool"}]}, {"type": "flatten"}, {"type": "dense", "units": 10}],
     "model.layers[0] (residual)", "keep its input's size"),
    ([{"type": "residual", "layers": [{"type": "relu"}, {"type": "conv2d", "filters": 2, "kernel_size": 3,
                                                         "strides": 2}]}, {"type": "flatten"},
      {"type": "dense", "units": 10}], "model.layers[0].layers[1] (conv2d)", "strides 1"),
    ([{"type": "flatten"}, {"type": "dense", "units": 7}], "model.layers", "needs 10"),
]


@pytest.mark.parametrize(("layers", "named", "why"), INVALID)
def test_an_invalid_list_is_refused_naming_its_layer(layers, named, why):
    with pytest.raises(ValidationError) as refused:
        JobSpec(framework="jax", model={"layers": layers})
    message = str(refused.value)
    assert named in message and why in message, message


def test_unknown_types_and_fields_are_refused_with_the_layers_index():
    for layers, where in (([{"type": "dense", "units": 4}, {"type": "lstm"}], "model.layers.1"),
                          ([{"type": "dense", "units": 10, "activation": "relu"}], "model.layers.0.dense"),
                          ([{"type": "dense", "units": 0}], "model.layers.0.dense.units")):
        with pytest.raises(ValidationError) as refused:
            JobSpec(framework="jax", model={"layers": layers})
        assert where in str(refused.value), str(refused.value)


@given(models())
@settings(max_examples=20, deadline=None)
def test_a_pool_or_conv_that_outgrows_the_image_is_refused(model):
    layers, shape = model
    if len(shape) != 3:
        return
    bad = [{"type": "max_pool", "window": max(shape[:2]) + 1}, *layers]
    with pytest.raises(LayerError, match=r"model\.layers\[0\] \(max_pool\)"):
        plan(LAYERS.validate_python(bad), shape, OUTPUTS)


def test_a_trained_list_loads_outside_trainhub_in_both_frameworks(tmp_path):
    """trainers.models.load: the job's spec.json and weights give its reported accuracy, in either framework."""
    import json

    from trainers import fit
    from trainers.data import load_dataset
    from trainers.models import load

    layers = [{"type": "conv2d", "filters": 4, "kernel_size": 3}, {"type": "batch_norm"}, {"type": "gelu"},
              {"type": "residual", "layers": [{"type": "conv2d", "filters": 6, "kernel_size": 3}, {"type": "relu"}]},
              {"type": "avg_pool", "window": 2}, {"type": "flatten"}, {"type": "dropout", "rate": 0.1},
              {"type": "dense", "units": 16}, {"type": "layer_norm"}, {"type": "silu"}, {"type": "dense", "units": 10}]
    spec = JobSpec(framework="jax", model={"layers": layers}, dataset={"name": "digits"}, epochs=2, batch_size=32)
    result = fit(spec, tmp_path, lambda epoch, metrics: None)
    data = load_dataset(spec.dataset)
    spec_json = json.loads((tmp_path / "spec.json").read_text())
    torch_model = load(tmp_path / "weights.safetensors", spec_json, framework="pytorch")
    module, variables = load(tmp_path / "weights.safetensors", tmp_path / "spec.json", framework="jax")
    with torch.no_grad():
        torch_logits = torch_model(torch.from_numpy(data.x_test.copy())).numpy()
    jax_logits = np.asarray(module.apply(variables, data.x_test))
    assert np.abs(torch_logits - jax_logits).max() < 1e-4
    accuracy = float(np.mean(jax_logits.argmax(axis=1) == data.y_test))
    assert accuracy == pytest.approx(result.result["test_accuracy"], abs=1 / len(data.y_test))


def test_the_weights_file_says_which_model_it_holds(tmp_path):
    """torch_models/jax_models.load_weights build a list model from the file alone (no spec)."""
    from trainers import fit
    from trainers.data import load_dataset

    layers = [{"type": "conv2d", "filters": 3, "kernel_size": 3}, {"type": "tanh"}, {"type": "avg_pool"},
              {"type": "flatten"}, {"type": "dense", "units": 10}]
    spec = JobSpec(framework="pytorch", model={"layers": layers}, dataset={"name": "digits"}, epochs=1, batch_size=64)
    fit(spec, tmp_path, lambda epoch, metrics: None)
    x = load_dataset(spec.dataset).x_test
    with torch.no_grad():
        torch_logits = torch_models.load_weights(tmp_path / "weights.safetensors")(torch.from_numpy(x.copy())).numpy()
    module, variables = jax_models.load_weights(tmp_path / "weights.safetensors")
    expected = reference.forward(plan(LAYERS.validate_python(layers), (8, 8, 1), 10),
                                 torch_models.read_weights(tmp_path / "weights.safetensors"), x)
    assert np.abs(torch_logits - expected).max() < 1e-4
    assert np.abs(np.asarray(module.apply(variables, x)) - expected).max() < 1e-4


def test_review_findings_are_refused_or_counted():
    from trainers.spec import activation_count, model_dropout

    digits = {"framework": "jax", "dataset": {"name": "digits"}}
    # A layer norm over one channel would zero every input.
    with pytest.raises(ValidationError, match=r"model\.layers\[0\] \(layer_norm\).*gives 0 for every input"):
        JobSpec(**digits, model={"layers": [{"type": "layer_norm"}, {"type": "flatten"}, {"type": "dense", "units": 10}]})
    # Activations are kept for the backward pass: the memory estimate counts them.
    gelus = [{"type": "conv2d", "filters": 8}, *[{"type": "gelu"}] * 5, {"type": "flatten"}, {"type": "dense", "units": 10}]
    assert activation_count(JobSpec(**digits, model={"layers": gelus})) == 6 * 8 * 64 + 8 * 64 + 10
    # Dropout anywhere in a list: a comparison checks predictions only.
    dropout = [{"type": "flatten"}, {"type": "dense", "units": 8}, {"type": "dropout", "rate": 0.3},
               {"type": "dense", "units": 10}]
    assert model_dropout(JobSpec(**digits, model={"layers": dropout}).model) == 0.3
    # A residual whose first layer is another residual reads the input as the first inner layer says.
    nested = [{"type": "residual", "layers": [{"type": "residual", "layers": [{"type": "dense", "units": 64}]}]},
              {"type": "dense", "units": 10}]
    assert JobSpec(**digits, model={"layers": nested})
    # Messages for lists and knob-less presets name what to change.
    with pytest.raises(ValidationError, match="use a layer list without batch_norm layers"):
        JobSpec(framework="jax", model={"name": "resnet8"}, privacy={})
    with pytest.raises(ValidationError, match=r"batch_norm at model.layers\[1\]"):
        JobSpec(**digits, batch_size=1, model={"layers": [{"type": "flatten"}, {"type": "batch_norm"},
                                                          {"type": "dense", "units": 10}]})
    with pytest.raises(ValidationError, match="model lenet5 does not fit the \\[8, 8, 1\\] examples of digits"):
        JobSpec(**digits, model={"name": "lenet5"})
    with pytest.raises(ValidationError, match="give a preset's name"):
        JobSpec(**digits, model={"name": None})


@pytest.mark.parametrize("kind", ["max_pool", "avg_pool"])
@pytest.mark.parametrize("size", [(8, 8), (7, 9)])
@pytest.mark.parametrize("ties", [False, True])  # ties: with a NaN too
def test_tiled_pooling_has_pytorchs_values_and_gradients(kind, size, ties):
    """The JAX models pool non-overlapping tiles by a reshape (jax_conv.tiled_pool): the values
    and input gradients of PyTorch's pooling (floor mode: a partial last tile is dropped; a max
    tile's gradient to its first maximum when several tie)."""
    import jax
    import jax.numpy as jnp

    x = np.random.default_rng(0).standard_normal((2, *size, 3)).astype(np.float32)  # NHWC
    if ties:  # most tiles hold equal values, some all four; one holds a NaN
        x = np.maximum(np.round(x), 0)
        x[0, 0, 1, 0] = np.nan
    weights = np.random.default_rng(1).standard_normal((2, size[0] // 2, size[1] // 2, 3)).astype(np.float32)

    def jax_loss(x):
        return jnp.sum(tiled_pool(x, 2, kind) * weights)

    value, grad = jax.value_and_grad(jax_loss)(jnp.asarray(x))
    xt = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    pool = F.max_pool2d if kind == "max_pool" else F.avg_pool2d
    torch_value = (pool(xt, 2) * torch.from_numpy(weights.transpose(0, 3, 1, 2))).sum()
    torch_value.backward()
    pooled = np.asarray(tiled_pool(jnp.asarray(x), 2, kind))
    np.testing.assert_allclose(pooled, pool(xt, 2).detach().numpy().transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(value), torch_value.item(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), xt.grad.numpy().transpose(0, 2, 3, 1), rtol=1e-5, atol=1e-6)
