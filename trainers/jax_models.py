"""The MLP and CNN in flax.linen, and conversion to and from the framework-neutral weights.

flax names the Dense layers `layers_0`, `layers_1`, ... with `kernel` [in, out] and `bias`
[out]; the weights files use PyTorch's `layers.0.weight` [out, in]. `params_from_weights` and
`weights_from_params` convert between the two, so either framework's weights load here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from trainers.common import BATCH_NORM_EPS, BATCH_NORM_MOMENTUM, Weights, describe, image_shape, read_weights
from trainers.spec import CONV_KERNEL, ModelSpec


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


class MLP(nn.Module):
    """x float32 [B, in_features] -> hidden_sizes (ReLU, then dropout) -> logits [B, num_classes].

    Dropout is active only with `train=True`, and then needs a `dropout` PRNG stream. With
    `batch_norm`, `norms_i` follows hidden layer i, before its ReLU (its statistics live in the
    `batch_stats` collection, updated with `train=True` and mutable=["batch_stats"]). `dtype` is
    the compute dtype (bfloat16 for mixed precision): params stay float32, logits come out float32.
    """

    hidden_sizes: Sequence[int]
    num_classes: int
    dropout: float = 0.0
    batch_norm: bool = False
    dtype: jnp.dtype = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        return self.head(x, train)

    def head(self, x: jax.Array, train: bool) -> jax.Array:
        x = x.astype(self.dtype)
        for i, size in enumerate(self.hidden_sizes):
            x = nn.Dense(size, name=f"layers_{i}", dtype=self.dtype)(x)
            if self.batch_norm:
                x = BatchNorm(name=f"norms_{i}")(x, train=train)
            x = nn.relu(x)
            if self.dropout > 0.0:
                x = nn.Dropout(self.dropout, deterministic=not train)(x)
        logits = nn.Dense(self.num_classes, name=f"layers_{len(self.hidden_sizes)}", dtype=self.dtype)(x)
        return logits.astype(jnp.float32)


class PatchConv(nn.Module):
    """A 3x3 "SAME" convolution as one matmul over the 9 shifted copies of the input (im2col):
    x [B, H, W, C] -> [B, H, W, 9C] @ kernel.reshape(9C, features) + bias -> [B, H, W, features].

    The same function and parameters as nn.Conv (`kernel` [3, 3, C, features] HWIO, `bias`), for
    XLA on the CPU, whose convolution gradients inside the epoch's lax.scan run as plain loops:
    measured on 2 cores, batch 128, conv 32 -> conv 64, one train step took ~2 s with nn.Conv
    and ~90 ms this way (PyTorch's eager step: ~60 ms). Its gradients are slices, pads and
    matmuls, which XLA runs at the matmul rate."""

    features: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        height, width, channels = x.shape[1:]
        kernel = self.param(
            "kernel", nn.initializers.lecun_normal(), (CONV_KERNEL, CONV_KERNEL, channels, self.features)
        )
        bias = self.param("bias", nn.initializers.zeros, (self.features,))
        pad = CONV_KERNEL // 2
        padded = jnp.pad(x, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
        # (row offset, column offset, channel) order: the order of kernel.reshape's rows.
        patches = jnp.concatenate(
            [padded[:, i : i + height, j : j + width, :] for i in range(CONV_KERNEL) for j in range(CONV_KERNEL)],
            axis=-1,
        )
        matrix = kernel.reshape(CONV_KERNEL * CONV_KERNEL * channels, self.features).astype(self.dtype)
        return patches.astype(self.dtype) @ matrix + bias.astype(self.dtype)


class CNN(MLP):
    """x float32 [B, H*W*C] -> [B, H, W, C] (NHWC; `image` = (H, W, C), default a square
    one-channel image of the features) -> per `channels`: 3x3 conv ("SAME"),
    [batch norm], ReLU, 2x2 max pool -> flattened in PyTorch's (C, H, W) order -> the MLP head.

    Conv kernels are `convs_i.kernel` [3, 3, in, out] (HWIO); the weights files hold them as
    PyTorch's OIHW. Flattening channel-first keeps the head's weights identical to PyTorch's.
    """

    channels: Sequence[int] = (32, 64)
    conv_as_matmul: bool = False  # PatchConv instead of nn.Conv (on the CPU: see PatchConv)
    image: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        height, width, channels = image_shape(self.image or x.shape[-1])
        x = x.reshape(x.shape[0], height, width, channels).astype(self.dtype)
        for i, channels in enumerate(self.channels):
            if self.conv_as_matmul:
                x = PatchConv(channels, name=f"convs_{i}", dtype=self.dtype)(x)
            else:
                x = nn.Conv(channels, (CONV_KERNEL, CONV_KERNEL), padding="SAME", name=f"convs_{i}", dtype=self.dtype)(
                    x
                )
            if self.batch_norm:
                x = BatchNorm(name=f"conv_norms_{i}")(x, train=train)
            x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = x.transpose(0, 3, 1, 2).reshape(x.shape[0], -1)
        return self.head(x, train)


def build(
    model: ModelSpec, num_classes: int, dtype: Any = jnp.float32, input_shape: Sequence[int] | None = None
) -> MLP:
    """The flax module `model` describes with `num_classes` outputs (1 for regression). Inputs come
    flat; a cnn reshapes them to `input_shape` [H, W, C] (default: a square one-channel image)."""
    common = dict(
        hidden_sizes=tuple(model.hidden_sizes),
        num_classes=num_classes,
        dropout=model.dropout,
        batch_norm=model.batch_norm,
        dtype=dtype,
    )
    if model.name == "cnn":
        image = tuple(input_shape) if input_shape is not None and len(input_shape) == 3 else ()
        return CNN(channels=tuple(model.channels), conv_as_matmul=jax.default_backend() == "cpu", image=image, **common)
    return MLP(**common)


# weights.safetensors name -> (flax collection, flax leaf) for each tensor kind, and the layout
# change: dense kernels [in, out] vs PyTorch's [out, in]; conv kernels HWIO vs OIHW.
_LEAVES = {"weight": ("params", "kernel"), "bias": ("params", "bias")}
_NORM_LEAVES = {
    "weight": ("params", "scale"),
    "bias": ("params", "bias"),
    "running_mean": ("batch_stats", "mean"),
    "running_var": ("batch_stats", "var"),
}


def variables_from_weights(weights: Weights) -> dict:
    """flax variables {"params": ..., ["batch_stats": ...]} from PyTorch-style weights of any model.

    `layers.i.weight` [out, in] -> params["layers_i"]["kernel"] [in, out]; `convs.i.weight` OIHW ->
    params["convs_i"]["kernel"] HWIO; `norms.i.weight/bias/running_mean/running_var` ->
    params["norms_i"]["scale"/"bias"], batch_stats["norms_i"]["mean"/"var"]. Raises ValueError
    for foreign names.
    """
    describe(weights)
    variables: dict = {"params": {}}
    for name, value in weights.items():
        group, index, kind = name.split(".")
        value = np.asarray(value)
        collection, leaf = (_NORM_LEAVES if "norms" in group else _LEAVES)[kind]
        if kind == "weight" and group == "layers":
            value = value.T
        elif kind == "weight" and group == "convs":
            value = value.transpose(2, 3, 1, 0)
        variables.setdefault(collection, {}).setdefault(f"{group}_{index}", {})[leaf] = jnp.asarray(value)
    return variables


def params_from_weights(weights: Weights) -> dict:
    """flax params {"layers_i": {"kernel": [in, out], "bias": [out]}, ...} from PyTorch-style weights."""
    return variables_from_weights(weights)["params"]


def weights_from_params(params: Mapping[str, Any], batch_stats: dict | None = None) -> Weights:
    """PyTorch-style numpy weights (`layers.i.weight` [out, in], `convs.i.weight` OIHW, ...) from
    flax params (and batch_stats); copies to host. The inverse of `variables_from_weights`."""
    host = jax.device_get({"params": params, "batch_stats": batch_stats or {}})
    weights: Weights = {}
    for collection, modules in host.items():
        for module, leaves in modules.items():
            group, index = module.rsplit("_", 1)
            table = _NORM_LEAVES if "norms" in group else _LEAVES
            for kind, (coll, leaf) in table.items():
                if coll != collection or leaf not in leaves:
                    continue
                value = np.asarray(leaves[leaf], dtype=np.float32)
                if kind == "weight" and group == "layers":
                    value = value.T
                elif kind == "weight" and group == "convs":
                    value = value.transpose(3, 2, 0, 1)
                weights[f"{group}.{index}.{kind}"] = np.ascontiguousarray(value)
    # The order init_weights uses, so the files list tensors alike whichever framework wrote them.
    return dict(sorted(weights.items(), key=lambda item: _order(item[0])))


def _order(name: str) -> tuple:
    group, index, kind = name.split(".")
    kinds = ("weight", "bias", "running_mean", "running_var")
    groups = {"convs": (0, 0), "conv_norms": (0, 1), "layers": (1, 0), "norms": (1, 1)}
    major, minor = groups[group]
    return (major, int(index), minor, kinds.index(kind))


def load_weights(path: Path, dropout: float = 0.0, input_shape: Sequence[int] | None = None) -> tuple[MLP, dict]:
    """(model, variables) from a weights.safetensors file written by either trainer: the flax
    variables as `model.init` lays them out ({"params": ...}, and "batch_stats" with batch norm),
    ready for `model.apply(variables, x, train=False)` and `evaluate`. A cnn's images are
    `input_shape` [H, W, C] (the job's spec.json; default: square, one channel).

    The architecture is read from the tensor shapes. Raises ValueError for other tensor names.
    """
    weights = read_weights(path)
    info = describe(weights)
    spec = ModelSpec.model_construct(
        name=info["name"],
        hidden_sizes=info["hidden_sizes"],
        dropout=dropout,
        channels=info["channels"] or [1],
        batch_norm=info["batch_norm"],
    )
    model = build(spec, info["num_classes"], input_shape=input_shape)
    return model, variables_from_weights(weights)


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
    model: MLP, params: dict, x: jax.Array, y: jax.Array, task: str = "classification"
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
    model: MLP, params: dict, x: np.ndarray, y: np.ndarray, task: str = "classification"
) -> tuple[float, float]:
    """(mean loss, mean score) over the whole of x [N, D], y [N]: (cross-entropy in nats, accuracy
    in [0, 1]) for classification, (squared error, absolute error) for regression."""
    loss, score = jax.jit(eval_metrics, static_argnums=(0, 4))(model, params, x, y, task)
    return float(loss), float(score)
