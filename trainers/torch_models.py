"""The MLP and CNN as PyTorch `nn.Module`s, and loading the framework-neutral weights into them.

`self.layers` is an `nn.ModuleList`, so the state_dict names are `layers.0.weight` [out, in],
`layers.0.bias` [out], ...: exactly the names and shapes of weights.safetensors.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainers.common import BATCH_NORM_EPS, BATCH_NORM_MOMENTUM, Weights, describe, image_shape, read_weights
from trainers.spec import CONV_KERNEL, ModelSpec


class MLP(nn.Module):
    """x float32 [B, in_features] -> hidden_sizes (ReLU, then dropout) -> logits [B, num_classes].

    With `batch_norm`, `self.norms[i]` (BatchNorm1d) follows hidden layer i, before its ReLU.
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: Sequence[int],
        num_classes: int,
        dropout: float = 0.0,
        batch_norm: bool = False,
    ) -> None:
        super().__init__()
        sizes = [in_features, *hidden_sizes, num_classes]
        self.layers = nn.ModuleList(nn.Linear(fan_in, fan_out) for fan_in, fan_out in zip(sizes[:-1], sizes[1:]))
        if batch_norm:  # only then: the seeds' MLP keeps exactly its state_dict names
            self.norms = nn.ModuleList(
                nn.BatchNorm1d(size, eps=BATCH_NORM_EPS, momentum=BATCH_NORM_MOMENTUM) for size in hidden_sizes
            )
        # Dropout holds no weights, so one module serves every hidden layer and the
        # state_dict keeps only the layers' names.
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers[:-1]):
            x = layer(x)
            if hasattr(self, "norms"):
                x = self.norms[i](x)
            x = self.dropout(F.relu(x))
        return self.layers[-1](x)


class CNN(MLP):
    """x float32 [B, H*W*C] -> [B, H, W, C] -> [B, C, H, W] (`image` = (H, W, C)) -> per
    `channels`: 3x3 conv (padding 1),
    [BatchNorm2d], ReLU, 2x2 max pool -> flattened (C, H, W) -> the MLP head -> logits [B, classes].

    Conv weights are `convs.i.weight` [out, in, 3, 3] (OIHW), the head's `layers.i.*` as in MLP.
    """

    def __init__(
        self,
        image: tuple[int, int, int],
        channels: Sequence[int],
        hidden_sizes: Sequence[int],
        num_classes: int,
        dropout: float = 0.0,
        batch_norm: bool = False,
    ) -> None:
        height, width, in_channels = image
        out_height, out_width = height >> len(channels), width >> len(channels)
        super().__init__(channels[-1] * out_height * out_width, hidden_sizes, num_classes, dropout, batch_norm)
        self.image = image
        c_in = [in_channels, *channels[:-1]]
        self.convs = nn.ModuleList(
            nn.Conv2d(i, o, CONV_KERNEL, padding=CONV_KERNEL // 2) for i, o in zip(c_in, channels)
        )
        if batch_norm:
            self.conv_norms = nn.ModuleList(
                nn.BatchNorm2d(c, eps=BATCH_NORM_EPS, momentum=BATCH_NORM_MOMENTUM) for c in channels
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Examples are flat in (row, column, channel) order; convolutions want (channel, row, column),
        # laid out as such: a permuted view of one channel would pass for channels-last, and
        # PyTorch would pick other conv kernels for it (other rounding than before colour images).
        height, width, channels = self.image
        if channels == 1:
            x = x.reshape(len(x), 1, height, width)
        else:
            x = x.reshape(len(x), height, width, channels).permute(0, 3, 1, 2).contiguous()
        for i, conv in enumerate(self.convs):
            x = conv(x)
            if hasattr(self, "conv_norms"):
                x = self.conv_norms[i](x)
            x = F.max_pool2d(F.relu(x), 2)
        return super().forward(x.flatten(1))


def build(model: ModelSpec, input_shape: int | Sequence[int], num_classes: int) -> MLP:
    """The nn.Module `model` describes with `num_classes` outputs (1 for regression), for flat
    inputs of `input_shape` ([D] or a feature count; a cnn: [H, W, C], see common.image_shape)."""
    if model.name == "cnn":
        return CNN(
            image_shape(input_shape), model.channels, model.hidden_sizes, num_classes, model.dropout, model.batch_norm
        )
    features = input_shape if isinstance(input_shape, int) else math.prod(input_shape)
    return MLP(features, model.hidden_sizes, num_classes, model.dropout, model.batch_norm)


def from_weights(weights: Weights, dropout: float = 0.0, input_shape: int | Sequence[int] | None = None) -> MLP:
    """The model stored in `weights` (PyTorch names, numpy arrays), holding them, on the CPU.

    A cnn's input shape is not in its weights: `input_shape` ([H, W, C], the job's spec.json, or a
    feature count read as a square one-channel image; default 784, a 28x28 image) says it.
    """
    info = describe(weights)
    spec = ModelSpec.model_construct(
        name=info["name"],
        hidden_sizes=info["hidden_sizes"],
        dropout=dropout,
        channels=info["channels"] or [1],
        batch_norm=info["batch_norm"],
    )
    model = build(spec, info["in_features"] or input_shape or 784, info["num_classes"])
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


def load_weights(path: Path, dropout: float = 0.0, input_shape: int | Sequence[int] | None = None) -> MLP:
    """An MLP (on the CPU, in eval mode) from a weights.safetensors file written by either trainer;
    a cnn's images are `input_shape` (see from_weights).

    The architecture is read from the tensor shapes. Raises ValueError for other tensor names.
    """
    return from_weights(read_weights(path), dropout, input_shape).eval()


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
