"""Models as PyTorch `nn.Module`s built from a layer list's plan (trainers/layers.py), and
loading the framework-neutral weights into them.

Each kind of parameterised layer lives in an `nn.ModuleList` named as its weights are
(`layers`, `convs`, `norms`, `conv_norms`, `layer_norms`, `residuals`), so the state_dict names
are exactly those of weights.safetensors: `layers.0.weight` [out, in], `convs.0.weight`
[out, in, k, k], ...
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

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
from trainers.layers import Layer, Op, plan_for
from trainers.presets import layers_of
from trainers.spec import ModelSpec
from trainers.torch_masks import hash32, hashed_dropout, uniform_dropout

GROUPS = ("layers", "convs", "norms", "conv_norms", "layer_norms", "residuals")


class LayerModel(nn.Module):
    """x float32 [B, D] -> the plan's layers -> outputs [B, outputs] (logits, or one value).

    Images are NCHW inside (the input, flat in (row, column, channel) order, is reshaped when a
    spatial layer first needs it); `flatten` gives (channel, row, column) order. Dropout is
    active in training mode; batch norm then updates its running statistics."""

    def __init__(self, ops: tuple[Op, ...], input_shape: tuple[int, ...]) -> None:
        super().__init__()
        self.ops, self.input_shape = ops, input_shape
        for group in GROUPS:
            setattr(self, group, nn.ModuleList())
        for op in ops:
            if op.name is not None:
                getattr(self, op.name.split(".")[-2]).append(_module(op, input_shape))

    def forward(self, x: torch.Tensor, dropout_key: torch.Tensor | None = None) -> torch.Tensor:
        """`dropout_key` (int32, 0-dim; the compiled step's, trainers.torch_step) makes dropout
        hash its masks from the key and the op's position instead of drawing them from torch's RNG."""
        for position, op in enumerate(self.ops):
            x = self.apply_op(op, x, None if dropout_key is None else dropout_key + position)
        return x

    def apply_op(self, op: Op, x: torch.Tensor, dropout_key: torch.Tensor | None = None) -> torch.Tensor:
        if op.reshapes_input:
            x = _as_image(x, self.input_shape)
        kind = op.kind
        if kind in ("dense", "conv2d", "batch_norm"):
            return self.module(op)(x.flatten(1) if kind == "dense" else x)
        if kind == "layer_norm":
            norm = self.module(op)
            return norm(x) if x.ndim == 2 else norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        if kind == "max_pool":
            return F.max_pool2d(x, op.arg("window"), op.arg("strides") or op.arg("window"))
        if kind == "avg_pool":
            return F.avg_pool2d(x, op.arg("window"), op.arg("strides") or op.arg("window"))
        if kind == "global_avg_pool":
            return x.mean(dim=(2, 3))
        if kind == "flatten":
            return x.flatten(1)
        if kind == "dropout" and dropout_key is not None:
            return hashed_dropout(x, op.arg("rate"), dropout_key)
        if kind == "dropout":
            return uniform_dropout(x, op.arg("rate")) if self.training and op.arg("rate") else x
        if kind == "residual":  # its own ops' keys: a hash of this op's, apart from the outer positions
            return self.module(op)(x, None if dropout_key is None else hash32(dropout_key))
        return ACTIVATIONS[kind](x)

    def module(self, op: Op) -> nn.Module:
        group, index = (op.name or "").split(".")[-2:]
        return getattr(self, group)[int(index)]


class Residual(LayerModel):
    """A residual block: its layers' output plus its input (through `projection` when the widths differ)."""

    def __init__(self, op: Op, input_shape: tuple[int, ...]) -> None:
        super().__init__(op.body, input_shape)
        self.image = op.out_state == "image"
        if op.projection is not None:
            c_in, c_out = op.in_shape[-1] if self.image else math.prod(op.in_shape), op.out_shape[-1]
            self.projection = nn.Conv2d(c_in, c_out, 1) if self.image else nn.Linear(c_in, c_out)

    def forward(self, x: torch.Tensor, dropout_key: torch.Tensor | None = None) -> torch.Tensor:
        x = x if self.image else x.flatten(1)
        out = super().forward(x, dropout_key)
        return out + (self.projection(x) if hasattr(self, "projection") else x)


def _module(op: Op, input_shape: tuple[int, ...]) -> nn.Module:
    """The module holding `op`'s parameters."""
    params = dict(op.params)
    weight = params.get(f"{op.name}.weight")
    if op.kind == "dense":
        assert weight is not None
        return nn.Linear(weight[1], weight[0], bias=op.arg("use_bias"))
    if op.kind == "conv2d":
        assert weight is not None
        k = op.arg("kernel_size")
        padding: int | str = 0 if op.arg("padding") == "valid" else (k // 2 if k % 2 else "same")
        return nn.Conv2d(weight[1], weight[0], k, stride=op.arg("strides"), padding=padding, bias=op.arg("use_bias"))
    if op.kind == "batch_norm":
        features = params[f"{op.name}.weight"][0]
        norm = nn.BatchNorm2d if op.out_state == "image" else nn.BatchNorm1d
        return norm(features, eps=BATCH_NORM_EPS, momentum=BATCH_NORM_MOMENTUM)
    if op.kind == "layer_norm":
        return nn.LayerNorm(params[f"{op.name}.weight"][0], eps=BATCH_NORM_EPS)
    return Residual(op, input_shape)


def _as_image(x: torch.Tensor, input_shape: tuple[int, ...]) -> torch.Tensor:
    """The flat input as NCHW images. One channel: a plain reshape (a permuted view would pass for
    channels-last, and PyTorch would pick other conv kernels, with other rounding)."""
    height, width, channels = image_shape(input_shape)
    if channels == 1:
        return x.reshape(len(x), 1, height, width)
    return x.reshape(len(x), height, width, channels).permute(0, 3, 1, 2).contiguous()


ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "gelu": F.gelu,
    "tanh": torch.tanh,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
}


def build(model: ModelSpec, input_shape: int | Sequence[int], num_classes: int) -> LayerModel:
    """The nn.Module `model` describes with `num_classes` outputs (1 for regression), for flat
    inputs of `input_shape` ([D] or a feature count; a cnn: [H, W, C], see common.image_shape)."""
    model_plan = plan_for(layers_of(model, num_classes), input_shape, num_classes)
    return LayerModel(model_plan.ops, model_plan.input_shape)


def from_weights(
    weights: Weights,
    dropout: float = 0.0,
    input_shape: int | Sequence[int] | None = None,
    layers: Sequence[Layer] | None = None,
) -> LayerModel:
    """The model stored in `weights` (PyTorch names, numpy arrays), holding them, on the CPU.

    A model given by its `layers` (a job's spec.json `model.layers`) is built from them; without,
    the weights' names and shapes say which preset (mlp or cnn) it is. An image model's input
    shape is not in its weights: `input_shape` ([H, W, C], the job's dataset, or a feature count
    read as a square one-channel image; default 784, a 28x28 image) says it.
    """
    if layers is None:
        info = describe(weights)
        spec = ModelSpec.model_construct(
            name=info["name"],
            hidden_sizes=info["hidden_sizes"],
            dropout=dropout,
            channels=info["channels"] or [1],
            batch_norm=info["batch_norm"],
        )
        model = build(spec, info["in_features"] or input_shape or 784, info["num_classes"])
    else:
        model_plan = plan_for(list(layers), input_shape or 784, output_width(weights))
        model = LayerModel(model_plan.ops, model_plan.input_shape)
    tensors = {name: torch.tensor(np.asarray(value)) for name, value in weights.items()}
    # BatchNorm's num_batches_tracked counts steps only for momentum=None, which is not used here;
    # weights.safetensors leaves it out, so it keeps its fresh value.
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    if unexpected or any(not name.endswith("num_batches_tracked") for name in missing):
        raise ValueError(f"weights do not fit the model: missing {missing}, unexpected {unexpected}")
    return model


def weights_from_state_dict(model: nn.Module) -> Weights:
    """numpy weights (PyTorch names) for weights.safetensors, without BatchNorm's step counters."""
    return {
        name: tensor.detach().cpu().numpy()
        for name, tensor in model.state_dict().items()
        if not name.endswith("num_batches_tracked")
    }


def load_weights(
    path: Path,
    dropout: float = 0.0,
    input_shape: int | Sequence[int] | None = None,
    layers: Sequence[Layer] | None = None,
) -> LayerModel:
    """The model (on the CPU, in eval mode) from a weights.safetensors file written by either
    trainer; its `layers` and `input_shape` as from_weights takes them.

    Without `layers`, the file's own record of its model is used (files written before it had one:
    a preset's architecture is read from the tensor shapes). Raises ValueError for other tensor names.
    """
    if layers is None:
        layers, recorded_shape = read_model(path)
        input_shape = input_shape or recorded_shape
    return from_weights(read_weights(path), dropout, input_shape, layers).eval()


def task_loss(logits: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    """The batch's mean loss: cross-entropy in nats for classification (y int64 classes), squared
    error of the single output for regression (y float32 targets)."""
    if task == "regression":
        return F.mse_loss(logits[:, 0], y)
    return F.cross_entropy(logits, y)


def score_sum(logits: torch.Tensor, y: torch.Tensor, task: str) -> torch.Tensor:
    """The batch's summed score: right predictions (classification) or absolute error (regression)."""
    if task == "regression":
        return (logits[:, 0] - y).abs().sum()
    return (logits.argmax(dim=1) == y).sum()


def target_dtype(task: str) -> torch.dtype:
    """y's dtype: int64 classes (cross_entropy wants them) or float32 targets."""
    return torch.float32 if task == "regression" else torch.int64


EVAL_BATCH = 1000  # examples evaluated at once, as trainers.jax_models.EVAL_BATCH


def evaluate(
    model: nn.Module, x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray, task: str = "classification"
) -> tuple[float, float]:
    """(mean loss, mean score) of `model` over the whole of x [N, D], y [N], EVAL_BATCH examples at
    a time: (cross-entropy in nats, accuracy in [0, 1]) for classification, (squared error,
    absolute error) for regression.

    Runs in eval mode (no dropout) under torch.no_grad() on the model's device; leaves the model
    in eval mode.
    """
    device = next(model.parameters()).device
    x = _tensor(x).to(device, torch.float32)
    y = _tensor(y).to(device, target_dtype(task))
    model.eval()
    loss_sum = torch.zeros((), device=device)
    score = torch.zeros((), dtype=target_dtype(task), device=device)
    with torch.no_grad():
        for first in range(0, len(x), EVAL_BATCH):  # the whole set at once would hold every example's activations
            logits = model(x[first : first + EVAL_BATCH])
            yb = y[first : first + EVAL_BATCH]
            if task == "regression":
                loss_sum += F.mse_loss(logits[:, 0], yb, reduction="sum")
            else:
                loss_sum += F.cross_entropy(logits, yb, reduction="sum")
            score += score_sum(logits, yb, task)
    return float(loss_sum) / len(x), float(score) / len(x)


def _tensor(value: torch.Tensor | np.ndarray) -> torch.Tensor:
    # A copy for numpy input: dataset arrays are read-only, which torch.from_numpy warns about.
    return torch.tensor(value) if isinstance(value, np.ndarray) else value
