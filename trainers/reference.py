"""A plan's initial weights and its forward pass in numpy: the one source of initial weights for
both trainers, and the reference both frameworks' models are checked against.

Weights are named and shaped as PyTorch names them (trainers/layers.py): dense `weight`
[out, in], conv `weight` [out, in, k, k] (OIHW), norms `weight`/`bias` [features] (batch norm
also `running_mean`, `running_var`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from trainers.layers import Op, Plan

Weights = dict[str, np.ndarray]
NORM_EPS = 1e-5  # PyTorch's default, used by both frameworks' batch and layer norms


def init(plan: Plan, seed: int) -> Weights:
    """Initial weights of `plan`, drawn in its order from np.random.default_rng(seed): dense and
    conv weights from N(0, 2 / fan_in) (He et al. 2015; fan_in = in x k x k for a conv), biases
    zeros; norms weight ones and bias zeros; batch norm's running mean zeros and variance ones.
    Norms draw nothing, so a model's other weights do not depend on whether it has them."""
    rng = np.random.default_rng(seed)
    weights: Weights = {}
    for name, shape in plan.param_shapes().items():
        kind = name.rsplit(".", 1)[1]
        if kind == "weight" and len(shape) > 1:
            scale = np.float32(np.sqrt(2.0 / math.prod(shape[1:])))
            weights[name] = rng.standard_normal(shape, dtype=np.float32) * scale
        elif kind in ("weight", "running_var"):
            weights[name] = np.ones(shape, np.float32)
        else:
            weights[name] = np.zeros(shape, np.float32)
    return weights


def forward(plan: Plan, weights: Weights, x: np.ndarray) -> np.ndarray:
    """Outputs float32 [N, outputs] (logits, or the predicted value) for flat inputs x [N, D], in
    eval mode (batch norm uses its running statistics, no dropout)."""
    h = np.asarray(x, np.float32)
    for op in plan.ops:
        h = _apply(op, weights, h, plan.input_shape)
    return h.astype(np.float32)


def _apply(op: Op, weights: Weights, h: np.ndarray, input_shape: tuple[int, ...]) -> np.ndarray:
    if op.reshapes_input:  # images are NCHW here, as in PyTorch
        height, width, channels = input_shape
        h = h.reshape(len(h), height, width, channels).transpose(0, 3, 1, 2)
    kind = op.kind
    if kind == "dense":
        h = h.reshape(len(h), -1) @ weights[f"{op.name}.weight"].T
        return h + weights[f"{op.name}.bias"] if f"{op.name}.bias" in weights else h
    if kind == "conv2d":
        return _conv(h, weights, op.name or "", op.arg("strides"), op.arg("padding"))
    if kind in ("max_pool", "avg_pool"):
        window = op.arg("window")
        strides = op.arg("strides") or window
        patches = np.lib.stride_tricks.sliding_window_view(h, (window, window), axis=(2, 3))[:, :, ::strides, ::strides]
        return patches.max(axis=(4, 5)) if kind == "max_pool" else patches.mean(axis=(4, 5))
    if kind == "global_avg_pool":
        return h.mean(axis=(2, 3))
    if kind == "flatten":
        return h.reshape(len(h), -1)
    if kind == "batch_norm":
        return _batch_norm(h, weights, op.name or "")
    if kind == "layer_norm":
        return _layer_norm(h, weights, op.name or "")
    if kind == "dropout":
        return h
    if kind == "residual":
        return _residual(op, weights, h, input_shape)
    return ACTIVATIONS[kind](h)


def _conv(h: np.ndarray, weights: Weights, name: str, strides: int, padding: str) -> np.ndarray:
    w = weights[f"{name}.weight"]
    k = w.shape[-1]
    if padding == "same":
        before = (k - 1) // 2
        h = np.pad(h, ((0, 0), (0, 0), (before, k - 1 - before), (before, k - 1 - before)))
    windows = np.lib.stride_tricks.sliding_window_view(h, (k, k), axis=(2, 3))[:, :, ::strides, ::strides]
    out = np.einsum("nchwij,ocij->nohw", windows, w, optimize=True)
    return out + weights[f"{name}.bias"][:, None, None] if f"{name}.bias" in weights else out


def _channel_shape(h: np.ndarray) -> list[int]:
    shape = [1] * h.ndim
    shape[1] = -1  # the channels (NCHW) or the features
    return shape


def _batch_norm(h: np.ndarray, weights: Weights, name: str) -> np.ndarray:
    def get(kind: str) -> np.ndarray:
        return weights[f"{name}.{kind}"].reshape(_channel_shape(h))

    return (h - get("running_mean")) / np.sqrt(get("running_var") + NORM_EPS) * get("weight") + get("bias")


def _layer_norm(h: np.ndarray, weights: Weights, name: str) -> np.ndarray:
    axis = 1  # the features, or each position's channels
    mean = h.mean(axis=axis, keepdims=True)
    var = h.var(axis=axis, keepdims=True)
    scale, shift = (weights[f"{name}.{kind}"].reshape(_channel_shape(h)) for kind in ("weight", "bias"))
    return (h - mean) / np.sqrt(var + NORM_EPS) * scale + shift


def _residual(op: Op, weights: Weights, h: np.ndarray, input_shape: tuple[int, ...]) -> np.ndarray:
    x = h if op.out_state == "image" else h.reshape(len(h), -1)
    out = x
    for inner in op.body:
        out = _apply(inner, weights, out, input_shape)
    if op.projection is None:
        return out + x
    w, b = weights[f"{op.projection}.weight"], weights[f"{op.projection}.bias"]
    if x.ndim == 4:
        return out + np.einsum("nchw,oc->nohw", x, w[:, :, 0, 0]) + b[:, None, None]
    return out + x @ w.T + b


ACTIVATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "relu": lambda h: np.maximum(h, 0.0),
    "gelu": lambda h: 0.5 * h * (1.0 + _erf(h / np.sqrt(2.0))),
    "tanh": np.tanh,
    "sigmoid": lambda h: 1.0 / (1.0 + np.exp(-h)),
    "silu": lambda h: h / (1.0 + np.exp(-h)),
}


def _erf(x: np.ndarray) -> np.ndarray:
    """scipy's erf, imported at the first gelu: scipy.special costs a fresh worker ~0.3 s to
    import, and most jobs never need it."""
    from scipy.special import erf

    return erf(x)
