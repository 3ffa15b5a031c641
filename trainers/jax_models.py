"""Models in flax.linen built from a layer list's plan (trainers/layers.py), and conversion to
and from the framework-neutral weights.

flax names the modules `layers_0`, `convs_1`, `residuals_0`/`convs_0` ... with `kernel` [in, out]
(dense) or HWIO (conv) and `bias`; the weights files use PyTorch's `layers.0.weight` [out, in]
and OIHW. `params_from_weights` and `weights_from_params` convert between the two, so either
framework's weights load here.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from trainers.common import (
    BATCH_NORM_EPS,
    BATCH_NORM_MOMENTUM,
    Weights,
    describe,
    image_shape,
    output_width,
    read_model,
    read_weights,
)
from trainers.jax_conv import CpuConv, tiled_pool
from trainers.layers import Layer, Op, plan_for
from trainers.presets import layers_of
from trainers.reference import NORM_EPS
from trainers.spec import ModelSpec


class BatchNorm(nn.Module):
    """Batch norm over the last axis with PyTorch's semantics, so both frameworks train and store
    the same statistics: running = (1 - momentum) * running + momentum * batch, the running
    variance unbiased (n / (n - 1)), the batch itself normalised with the biased one. flax's own
    BatchNorm keeps the biased variance. Params `scale`, `bias`; batch_stats `mean`, `var`;
    statistics in float32 whatever the compute dtype.
    """

    momentum: float = BATCH_NORM_MOMENTUM
    epsilon: float = BATCH_NORM_EPS

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
        features = x.shape[-1]
        scale = self.param("scale", nn.initializers.ones, (features,))
        bias = self.param("bias", nn.initializers.zeros, (features,))
        running_mean = self.variable("batch_stats", "mean", jnp.zeros, (features,), jnp.float32)
        running_var = self.variable("batch_stats", "var", jnp.ones, (features,), jnp.float32)
        x32 = x.astype(jnp.float32)
        if train:
            axes = tuple(range(x.ndim - 1))
            mean, var = x32.mean(axes), x32.var(axes)
            if not self.is_initializing():
                n = x.size // features
                running_mean.value = (1 - self.momentum) * running_mean.value + self.momentum * mean
                running_var.value = (1 - self.momentum) * running_var.value + self.momentum * var * n / (n - 1)
        else:
            mean, var = running_mean.value, running_var.value
        return ((x32 - mean) * jax.lax.rsqrt(var + self.epsilon) * scale + bias).astype(x.dtype)


class LayerModel(nn.Module):
    """x float32 [B, D] -> the plan's layers -> outputs [B, outputs] float32 (logits, or one value).

    Images are NHWC inside (the input, flat in (row, column, channel) order, is reshaped when a
    spatial layer first needs it); `flatten` gives PyTorch's (channel, row, column) order, so a
    dense layer after it holds the same weights as PyTorch's. Submodules are named as the
    weights (`layers_0`, `convs_1`, `residuals_0` ...). Dropout is active only with `train=True`,
    and then needs a `dropout` PRNG stream; batch norm's statistics live in the `batch_stats`
    collection (updated with `train=True` and mutable=["batch_stats"]). `dtype` is the compute
    dtype (bfloat16 for mixed precision): params stay float32."""

    ops: tuple[Op, ...]
    input_shape: tuple[int, ...]
    dtype: Any = jnp.float32
    conv_as_matmul: bool = False  # CpuConv for every convolution (on the CPU: see trainers.jax_conv)

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        x = x.astype(self.dtype)
        for op in self.ops:
            x = self.apply_op(op, x, train)
        return x.astype(jnp.float32)

    def apply_op(self, op: Op, x: jax.Array, train: bool) -> jax.Array:
        if op.reshapes_input:
            # No input shape given (a weights file's model): a square one-channel image.
            height, width, channels = image_shape(self.input_shape or x.shape[-1])
            x = x.reshape(x.shape[0], height, width, channels)
        kind = op.kind
        if kind == "dense":
            units = dict(op.params)[f"{op.name}.weight"][0]
            dense = nn.Dense(units, use_bias=op.arg("use_bias"), name=op.local_name, dtype=self.dtype)
            return dense(x.reshape(x.shape[0], -1))
        if kind == "conv2d":
            return self.conv(op)(x)
        if kind == "batch_norm":
            return BatchNorm(name=op.local_name)(x, train=train)
        if kind == "layer_norm":
            return nn.LayerNorm(epsilon=NORM_EPS, use_fast_variance=False, name=op.local_name, dtype=self.dtype)(x)
        if kind in ("max_pool", "avg_pool"):
            window, strides = op.arg("window"), op.arg("strides") or op.arg("window")
            if window == strides:
                return tiled_pool(x, window, kind)
            pool = nn.max_pool if kind == "max_pool" else nn.avg_pool
            return pool(x, (window, window), strides=(strides, strides))
        if kind == "global_avg_pool":
            return x.mean(axis=(1, 2))
        if kind == "flatten":
            return x.transpose(0, 3, 1, 2).reshape(x.shape[0], -1) if x.ndim == 4 else x
        if kind == "dropout":
            return nn.Dropout(op.arg("rate"), deterministic=not train)(x)
        if kind == "residual":
            block = Residual(
                ops=op.body,
                input_shape=self.input_shape,
                project=op.projection is not None,
                image=op.out_state == "image",
                dtype=self.dtype,
                conv_as_matmul=self.conv_as_matmul,
                name=op.local_name,
            )
            return block(x, train=train)
        return ACTIVATIONS[kind](x)

    def conv(self, op: Op) -> nn.Module:
        filters, k, s = dict(op.params)[f"{op.name}.weight"][0], op.arg("kernel_size"), op.arg("strides")
        use_bias, padding = op.arg("use_bias"), op.arg("padding").upper()
        if self.conv_as_matmul:
            return CpuConv(filters, k, s, padding, use_bias=use_bias, name=op.local_name, dtype=self.dtype)
        return nn.Conv(filters, (k, k), (s, s), padding, use_bias=use_bias, name=op.local_name, dtype=self.dtype)


class Residual(LayerModel):
    """A residual block: its layers' output plus its input (through `projection`, a 1x1 conv or a
    dense layer, when the widths differ)."""

    project: bool = False
    image: bool = False

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        x = x if self.image else x.reshape(x.shape[0], -1)
        out = x
        for op in self.ops:
            out = self.apply_op(op, out, train)
        if not self.project:
            return out + x
        width = out.shape[-1]
        conv = partial(CpuConv, kernel_size=1) if self.conv_as_matmul else partial(nn.Conv, kernel_size=(1, 1))
        projection = (
            conv(width, name="projection", dtype=self.dtype)
            if self.image
            else nn.Dense(width, name="projection", dtype=self.dtype)
        )
        return out + projection(x)


ACTIVATIONS = {
    "relu": nn.relu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # PyTorch's default, the exact form
    "tanh": jnp.tanh,
    "sigmoid": nn.sigmoid,
    "silu": nn.silu,
}


def build_layers(
    layers: Sequence[Layer], outputs: int, input_shape: Sequence[int] | int | None = None, dtype: Any = jnp.float32
) -> LayerModel:
    """The flax module of `layers` for inputs of `input_shape` ([D], [H, W, C], or a feature count
    as layers.plan_for reads it; None: image layers read the input as a square one-channel image
    of its features) with `outputs` units out."""
    shape = input_shape if isinstance(input_shape, int) or input_shape is None else tuple(input_shape)
    model_plan = plan_for(list(layers), shape if shape is not None else 784, outputs)
    known = model_plan.input_shape if input_shape is not None else ()
    return LayerModel(model_plan.ops, known, dtype, conv_as_matmul=jax.default_backend() == "cpu")


def build(
    model: ModelSpec, num_classes: int, dtype: Any = jnp.float32, input_shape: Sequence[int] | None = None
) -> LayerModel:
    """The flax module `model` describes with `num_classes` outputs (1 for regression). Inputs come
    flat; image layers read them as `input_shape` [H, W, C] (default: a square one-channel image
    of the features, for weights files that do not say)."""
    return build_layers(layers_of(model, num_classes), num_classes, input_shape, dtype)


# weights.safetensors name -> (flax collection, flax leaf) for each tensor kind, and the layout
# change: dense kernels [in, out] vs PyTorch's [out, in]; conv kernels HWIO vs OIHW.
_LEAVES = {"weight": ("params", "kernel"), "bias": ("params", "bias")}
_NORM_LEAVES = {
    "weight": ("params", "scale"),
    "bias": ("params", "bias"),
    "running_mean": ("batch_stats", "mean"),
    "running_var": ("batch_stats", "var"),
}


def _path(name: str) -> tuple[list[str], str]:
    """A weights name as (flax module path, tensor kind): `residuals.0.convs.1.weight` ->
    (["residuals_0", "convs_1"], "weight"); `residuals.0.projection.bias` -> (["residuals_0",
    "projection"], "bias")."""
    *tokens, kind = name.split(".")
    path, i = [], 0
    while i < len(tokens):
        if i + 1 < len(tokens) and tokens[i + 1].isdigit():
            path.append(f"{tokens[i]}_{tokens[i + 1]}")
            i += 2
        else:
            path.append(tokens[i])
            i += 1
    return path, kind


def _is_norm(path: list[str]) -> bool:
    return bool(path) and "norms" in path[-1]  # norms_i, conv_norms_i, layer_norms_i


def variables_from_weights(weights: Weights) -> dict:
    """flax variables {"params": ..., ["batch_stats": ...]} from PyTorch-style weights of any model.

    A dense `weight` [out, in] -> `kernel` [in, out]; a conv `weight` OIHW -> `kernel` HWIO;
    norms' `weight`/`bias` -> params `scale`/`bias`, batch norm's `running_mean`/`running_var` ->
    batch_stats `mean`/`var`; each under its module path (`layers_0`, `residuals_0`/`convs_1`).
    Raises ValueError for foreign names."""
    variables: dict = {"params": {}}
    for name, value in weights.items():
        path, kind = _path(name)
        table = _NORM_LEAVES if _is_norm(path) else _LEAVES
        if not path or kind not in table:
            raise ValueError(f"not the weights of a trainhub model: {name!r} is no layer's tensor")
        collection, leaf = table[kind]
        value = np.asarray(value)
        if leaf == "kernel":
            value = value.T if value.ndim == 2 else value.transpose(2, 3, 1, 0)
        node = variables.setdefault(collection, {})
        for segment in path:
            node = node.setdefault(segment, {})
        node[leaf] = jnp.asarray(value)
    return variables


def params_from_weights(weights: Weights) -> dict:
    """flax params {"layers_i": {"kernel": [in, out], "bias": [out]}, ...} from PyTorch-style weights."""
    return variables_from_weights(weights)["params"]


def weights_from_params(
    params: Mapping[str, Any], batch_stats: dict | None = None, order: Sequence[str] | None = None
) -> Weights:
    """PyTorch-style numpy weights (`layers.i.weight` [out, in], `convs.i.weight` OIHW, ...) from
    flax params (and batch_stats); copies to host. The inverse of `variables_from_weights`. The
    tensors come in `order` (a plan's param_shapes), else in the presets' order."""
    host = jax.device_get({"params": params, "batch_stats": batch_stats or {}})
    weights: Weights = {}
    for collection, modules in host.items():
        _collect(collection, modules, [], weights)
    rank = {name: i for i, name in enumerate(order or ())}
    # The order init_weights uses, so the files list tensors alike whichever framework wrote them.
    return dict(sorted(weights.items(), key=lambda item: (rank.get(item[0], len(rank)), _order(item[0]))))


def _collect(collection: str, node: Mapping[str, Any], path: list[str], weights: Weights) -> None:
    for key, value in node.items():
        if isinstance(value, Mapping):
            _collect(collection, value, [*path, key], weights)
            continue
        table = _NORM_LEAVES if _is_norm(path) else _LEAVES
        kind = next(k for k, (coll, leaf) in table.items() if coll == collection and leaf == key)
        array = np.asarray(value, dtype=np.float32)
        if key == "kernel":
            array = array.T if array.ndim == 2 else array.transpose(3, 2, 0, 1)
        prefix = ".".join(_weights_segment(segment) for segment in path)
        weights[f"{prefix}.{kind}"] = np.ascontiguousarray(array)


def _weights_segment(segment: str) -> str:
    """A flax module name as the weights spell it: `conv_norms_0` -> `conv_norms.0`; `projection` stays."""
    group, _, index = segment.rpartition("_")
    return f"{group}.{index}" if index.isdigit() else segment


def _order(name: str) -> tuple:
    """The presets' order: conv layers (each with its norm), then dense layers (each with its norm)."""
    parts = name.split(".")
    groups = {"convs": (0, 0), "conv_norms": (0, 1), "layers": (1, 0), "norms": (1, 1)}
    if len(parts) != 3 or parts[0] not in groups:
        return (2, 0, 0, 0, name)
    group, index, kind = parts
    kinds = ("weight", "bias", "running_mean", "running_var")
    major, minor = groups[group]
    return (major, int(index), minor, kinds.index(kind), name)


def load_weights(
    path: Path,
    dropout: float = 0.0,
    input_shape: Sequence[int] | int | None = None,
    layers: Sequence[Layer] | None = None,
) -> tuple[LayerModel, dict]:
    """(model, variables) from a weights.safetensors file written by either trainer: the flax
    variables as `model.init` lays them out ({"params": ...}, and "batch_stats" with batch norm),
    ready for `model.apply(variables, x, train=False)` and `evaluate`. A model given by its
    `layers` (spec.json's model.layers) is built from them, a preset from the tensor shapes; image
    layers read the input as `input_shape` [H, W, C] (the job's dataset; default: square, one
    channel). Raises ValueError for tensor names of no model."""
    weights = read_weights(path)
    if layers is None:
        layers, recorded_shape = read_model(path)
        input_shape = input_shape or recorded_shape
    if layers is None:
        info = describe(weights)
        spec = ModelSpec.model_construct(
            name=info["name"],
            hidden_sizes=info["hidden_sizes"],
            dropout=dropout,
            channels=info["channels"] or [1],
            batch_norm=info["batch_norm"],
        )
        layers = layers_of(spec, info["num_classes"])
        input_shape = info["in_features"] or input_shape
        outputs = info["num_classes"]
    else:
        outputs = output_width(weights)
    return build_layers(layers, outputs, input_shape), variables_from_weights(weights)


def _variables(params: dict) -> dict:
    """{"params": ...} for bare params; full variables (with batch_stats) pass through."""
    return params if "params" in params else {"params": params}


# Examples evaluated at once: the whole test set in one batch would hold every example's
# activations (tens of GB for a wide CNN on 10,000 images).
EVAL_BATCH = 1000


def losses(logits: jax.Array, y: jax.Array, task: str) -> tuple[jax.Array, jax.Array]:
    """Per-example (loss, score) for logits [B, outputs] and targets y [B]: classification's
    cross-entropy in nats and whether the argmax is right; regression's squared error and
    absolute error of the single output."""
    if task == "regression":
        error = logits[:, 0] - y
        return error * error, jnp.abs(error)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y), jnp.argmax(logits, axis=-1) == y


def eval_metrics(
    model: LayerModel | UserModule, params: dict, x: jax.Array, y: jax.Array, task: str = "classification"
) -> tuple[jax.Array, jax.Array]:
    """Traceable (mean loss, mean score) of `model` on x [N, D], y [N] (see `losses`: cross-entropy
    and accuracy, or squared and absolute error), EVAL_BATCH examples at a time (`jax.lax.map`
    over the batches; the last padded and masked)."""
    n = x.shape[0]
    batches = -(-n // EVAL_BATCH)
    pad = batches * EVAL_BATCH - n
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape(batches, EVAL_BATCH, *x.shape[1:])
    y = jnp.pad(y, (0, pad)).reshape(batches, EVAL_BATCH)
    real = (jnp.arange(batches * EVAL_BATCH) < n).reshape(batches, EVAL_BATCH)

    def sums(batch: tuple[jax.Array, jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        xb, yb, realb = batch
        logits = cast(jax.Array, model.apply(_variables(params), xb, train=False))  # not mutable: logits only
        loss, score = losses(logits, yb, task)
        return jnp.sum(jnp.where(realb, loss, 0.0)), jnp.sum(jnp.where(realb, score, 0.0))

    loss_sums, scores = jax.lax.map(sums, (x, y, real))
    return loss_sums.sum() / n, scores.sum() / n


def evaluate(
    model: LayerModel, params: dict, x: np.ndarray, y: np.ndarray, task: str = "classification"
) -> tuple[float, float]:
    """(mean loss, mean score) over the whole of x [N, D], y [N]: (cross-entropy in nats, accuracy
    in [0, 1]) for classification, (squared error, absolute error) for regression."""
    loss, score = jax.jit(eval_metrics, static_argnums=(0, 4))(model, params, x, y, task)
    return float(loss), float(score)


# --- user code: the user's own flax module ------------------------------------------------------

# flax leaf -> PyTorch's name for it (user code's weights.safetensors); kernels are transposed too.
_USER_LEAVES = {
    ("params", "kernel"): "weight",
    ("params", "scale"): "weight",
    ("params", "embedding"): "weight",
    ("batch_stats", "mean"): "running_mean",
    ("batch_stats", "var"): "running_var",
}


@dataclass(frozen=True)
class UserModule:
    """The user's flax module as the trainer applies it: `apply(variables, x, train=..., **kw)`
    passes `train` on only when the module's `__call__` takes it, and returns float32 outputs.
    `dtype` bfloat16 (bf16): the params and the input are cast to it for the forward pass (the
    params stay float32 in the state, so their gradients are float32 too)."""

    module: nn.Module
    takes_train: bool
    dtype: Any = jnp.float32

    @classmethod
    def of(cls, module: Any, dtype: Any = jnp.float32) -> UserModule:
        if not isinstance(module, nn.Module):
            raise TypeError(f"the entrypoint returned a {type(module).__name__}, not a flax.linen Module")
        parameters = inspect.signature(type(module).__call__).parameters
        return cls(module, "train" in parameters, dtype)

    def apply(self, variables: Mapping[str, Any], x: jax.Array, *, train: bool = False, **kwargs: Any) -> Any:
        if self.dtype != jnp.float32:
            variables = {**variables, "params": jax.tree.map(lambda p: p.astype(self.dtype), variables["params"])}
            x = x.astype(self.dtype)
        extra: dict[str, Any] = {"train": train} if self.takes_train else {}
        out = self.module.apply(variables, x, **extra, **kwargs)
        if kwargs.get("mutable"):
            logits, updates = out
            return jnp.asarray(logits, jnp.float32), updates
        return jnp.asarray(out, jnp.float32)

    def init(self, seed: int, input_shape: Sequence[int]) -> dict:
        """The module's own initial variables from PRNGKey(seed), for a batch [1, prod(input_shape)]."""
        x = jnp.zeros((1, int(np.prod(input_shape))), jnp.float32)
        key = jax.random.PRNGKey(seed)
        extra: dict[str, Any] = {"train": False} if self.takes_train else {}
        return jax.device_get(dict(self.module.init({"params": key, "dropout": key}, x, **extra)))


def _user_leaves(variables: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str, tuple[int, ...] | None]]:
    """(the leaf's path in `variables`, its PyTorch-style name, the transpose to PyTorch's layout
    or None) for each leaf of params and batch_stats: module names as the weights spell them
    (`layers_0` -> `layers.0`), kernels as `weight` [out, in] (dense), OIHW (conv), scales as `weight`."""
    found: list[tuple[tuple[str, ...], str, tuple[int, ...] | None]] = []

    def walk(node: Mapping[str, Any], path: tuple[str, ...]) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, (*path, key))
                continue
            collection, modules = path[0], path[1:]
            leaf = _USER_LEAVES.get((collection, key), key)
            axes = _KERNEL_AXES.get(np.ndim(value)) if key == "kernel" else None
            found.append(((*path, key), ".".join([*(_weights_segment(s) for s in modules), leaf]), axes))

    walk({c: variables[c] for c in ("params", "batch_stats") if c in variables}, ())
    return found


# flax kernel -> PyTorch weight: [in, out] -> [out, in]; WIO -> OIW; HWIO -> OIHW; DHWIO -> OIDHW.
_KERNEL_AXES = {2: (1, 0), 3: (2, 1, 0), 4: (3, 2, 0, 1), 5: (4, 3, 0, 1, 2)}


def _leaf(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def user_weights(variables: Mapping[str, Any]) -> Weights:
    """PyTorch-style float32 weights of a user module's params (and batch_stats), in its own order
    (see _user_leaves): the names a torch module written the same way has in its state_dict."""
    host = jax.device_get(dict(variables))
    weights: Weights = {}
    for path, name, axes in _user_leaves(host):
        array = np.asarray(_leaf(host, path), dtype=np.float32)
        weights[name] = np.ascontiguousarray(array if axes is None else array.transpose(axes))
    return weights


def with_user_weights(variables: Mapping[str, Any], weights: Weights) -> dict:
    """`variables` with each leaf replaced by its PyTorch-style tensor in `weights`, laid out back
    as flax has it: the inverse of `user_weights`."""
    out = jax.tree.map(np.asarray, jax.device_get(dict(variables)))
    for path, name, axes in _user_leaves(out):
        array = np.asarray(weights[name], np.float32)
        _leaf(out, path[:-1])[path[-1]] = array if axes is None else array.transpose(np.argsort(axes))
    return out
