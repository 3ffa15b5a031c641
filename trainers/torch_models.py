"""The MLP as a PyTorch `nn.Module`, and loading the framework-neutral weights into it.

`self.layers` is an `nn.ModuleList`, so the state_dict names are `layers.0.weight` [out, in],
`layers.0.bias` [out], ...: exactly the names and shapes of weights.safetensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from trainers.common import Weights, architecture, read_weights


class MLP(nn.Module):
    """x float32 [B, in_features] -> hidden_sizes (ReLU, then dropout) -> logits [B, num_classes]."""

    def __init__(
        self, in_features: int, hidden_sizes: Sequence[int], num_classes: int, dropout: float = 0.0
    ) -> None:
        super().__init__()
        sizes = [in_features, *hidden_sizes, num_classes]
        self.layers = nn.ModuleList(
            nn.Linear(fan_in, fan_out) for fan_in, fan_out in zip(sizes[:-1], sizes[1:])
        )
        # Dropout holds no weights, so one module serves every hidden layer and the
        # state_dict keeps only the layers' names.
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = self.dropout(F.relu(layer(x)))
        return self.layers[-1](x)


def from_weights(weights: Weights, dropout: float = 0.0) -> MLP:
    """An MLP shaped after `weights` (PyTorch names, numpy arrays) and holding them, on the CPU."""
    in_features, hidden_sizes, num_classes = architecture(weights)
    model = MLP(in_features, hidden_sizes, num_classes, dropout)
    model.load_state_dict({name: torch.tensor(np.asarray(value)) for name, value in weights.items()})
    return model


def load_weights(path: Path, dropout: float = 0.0) -> MLP:
    """An MLP (on the CPU, in eval mode) from a weights.safetensors file written by either trainer.

    The architecture is read from the tensor shapes. Raises ValueError for other tensor names.
    """
    return from_weights(read_weights(path), dropout).eval()


def evaluate(model: MLP, x: torch.Tensor | np.ndarray, y: torch.Tensor | np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy in nats, accuracy in [0, 1]) of `model` over the whole of x [N, D], y [N].

    Runs in eval mode (no dropout) under torch.no_grad() on the model's device; leaves the model
    in eval mode.
    """
    device = next(model.parameters()).device
    x = _tensor(x).to(device, torch.float32)
    y = _tensor(y).to(device, torch.int64)
    model.eval()
    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        accuracy = (logits.argmax(dim=1) == y).float().mean()
    return float(loss), float(accuracy)


def _tensor(value: torch.Tensor | np.ndarray) -> torch.Tensor:
    # A copy for numpy input: dataset arrays are read-only, which torch.from_numpy warns about.
    return torch.tensor(value) if isinstance(value, np.ndarray) else value
