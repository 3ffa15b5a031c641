"""The MLP in flax.linen, and conversion to and from the framework-neutral weights.

flax names the Dense layers `layers_0`, `layers_1`, ... with `kernel` [in, out] and `bias`
[out]; the weights files use PyTorch's `layers.0.weight` [out, in]. `params_from_weights` and
`weights_from_params` convert between the two, so either framework's weights load here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from trainers.common import Weights, architecture, read_weights


class MLP(nn.Module):
    """x float32 [B, in_features] -> hidden_sizes (ReLU, then dropout) -> logits [B, num_classes].

    Dropout is active only with `train=True`, and then needs a `dropout` PRNG stream.
    """

    hidden_sizes: Sequence[int]
    num_classes: int
    dropout: float = 0.0

    @nn.compact
    def __call__(self, x: jax.Array, *, train: bool = False) -> jax.Array:
        for i, size in enumerate(self.hidden_sizes):
            x = nn.relu(nn.Dense(size, name=f"layers_{i}")(x))
            if self.dropout > 0.0:
                x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(self.num_classes, name=f"layers_{len(self.hidden_sizes)}")(x)


def params_from_weights(weights: Weights) -> dict:
    """flax params {"layers_i": {"kernel": [in, out], "bias": [out]}} from PyTorch-style weights."""
    count = len(architecture(weights)[1]) + 1
    return {
        f"layers_{i}": {
            "kernel": jnp.asarray(np.asarray(weights[f"layers.{i}.weight"]).T),
            "bias": jnp.asarray(weights[f"layers.{i}.bias"]),
        }
        for i in range(count)
    }


def weights_from_params(params: dict) -> Weights:
    """PyTorch-style numpy weights (`layers.i.weight` [out, in]) from flax params; copies to host."""
    host = jax.device_get(params)
    weights: Weights = {}
    for i in range(len(host)):
        layer = host[f"layers_{i}"]
        weights[f"layers.{i}.weight"] = np.ascontiguousarray(np.asarray(layer["kernel"]).T)
        weights[f"layers.{i}.bias"] = np.asarray(layer["bias"])
    return weights


def load_weights(path: Path, dropout: float = 0.0) -> tuple[MLP, dict]:
    """(model, params) from a weights.safetensors file written by either trainer.

    The architecture is read from the tensor shapes. Raises ValueError for other tensor names.
    """
    weights = read_weights(path)
    _, hidden_sizes, num_classes = architecture(weights)
    model = MLP(hidden_sizes=tuple(hidden_sizes), num_classes=num_classes, dropout=dropout)
    return model, params_from_weights(weights)


def eval_metrics(model: MLP, params: dict, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Traceable (mean cross-entropy in nats, accuracy in [0, 1]) of `model` on x [N, D], y [N]."""
    logits = model.apply({"params": params}, x, train=False)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    accuracy = jnp.mean(jnp.argmax(logits, axis=-1) == y)
    return loss, accuracy


def evaluate(model: MLP, params: dict, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean cross-entropy in nats, accuracy in [0, 1]) over the whole of x [N, D], y [N]."""
    loss, accuracy = jax.jit(eval_metrics, static_argnums=0)(model, params, x, y)
    return float(loss), float(accuracy)
