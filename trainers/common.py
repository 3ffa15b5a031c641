"""Framework-neutral pieces both trainers share: initial weights, batch order, timings, artifacts.

Weights are numpy arrays named and shaped as PyTorch names them (`layers.0.weight` [out, in],
`layers.0.bias` [out], ..., `layers.k` the output layer), so a JAX job and a PyTorch job with
the same spec start from the same weights, see the same batches and write the same files.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Sequence

import numpy as np
from safetensors.numpy import load_file, save_file

from trainers.base import EpochMetrics, check_finite
from trainers.spec import JobSpec

Weights = dict[str, np.ndarray]


def init_params(in_features: int, hidden_sizes: Sequence[int], num_classes: int, seed: int) -> Weights:
    """Initial MLP weights for `in_features` -> hidden_sizes -> `num_classes`.

    Layer i has `layers.i.weight` float32 [out, in] drawn from N(0, 2/fan_in) (He et al. 2015,
    the seeds' `sqrt(2.0 / 784)` scale) and `layers.i.bias` float32 [out] of zeros. Layers are
    drawn in order from np.random.default_rng(seed), so the result depends on the seed only.
    """
    rng = np.random.default_rng(seed)
    sizes = [in_features, *hidden_sizes, num_classes]
    weights: Weights = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        scale = np.float32(np.sqrt(2.0 / fan_in))
        weights[f"layers.{i}.weight"] = rng.standard_normal((fan_out, fan_in), dtype=np.float32) * scale
        weights[f"layers.{i}.bias"] = np.zeros(fan_out, dtype=np.float32)
    return weights


def architecture(weights: Weights) -> tuple[int, list[int], int]:
    """(in_features, hidden_sizes, num_classes) of MLP weights named as by `init_params`.

    Raises ValueError when the names are not `layers.0.weight`, `layers.0.bias`, ... in order.
    """
    count = len(weights) // 2
    expected = {f"layers.{i}.{kind}" for i in range(count) for kind in ("weight", "bias")}
    if count == 0 or set(weights) != expected:
        raise ValueError(f"not MLP weights: expected {sorted(expected)}, got {sorted(weights)}")
    shapes = [weights[f"layers.{i}.weight"].shape for i in range(count)]
    return shapes[0][1], [out for out, _ in shapes[:-1]], shapes[-1][0]


def epoch_batches(seed: int, epoch: int, n: int, batch_size: int) -> np.ndarray:
    """The batch order of one epoch: int32 [n // batch_size, batch_size] indices into [0, n).

    A permutation drawn from np.random.default_rng((seed, epoch)), the same in both frameworks.
    The final partial batch is dropped, so every step has the same shape: JAX compiles the
    train step once for that shape instead of again for a smaller last batch, and both
    frameworks average the loss over the same number of examples per step. The dropped
    examples differ from epoch to epoch. Raises ValueError when batch_size > n.
    """
    if not 1 <= batch_size <= n:
        raise ValueError(f"batch_size {batch_size} must be between 1 and the {n} training examples")
    steps = n // batch_size
    order = np.random.default_rng((seed, epoch)).permutation(n)
    return order[: steps * batch_size].reshape(steps, batch_size).astype(np.int32)


def summarize_epoch(
    epoch: int, *, loss_sum: float, correct: float, steps: int, batch_size: int,
    test_loss: float, test_accuracy: float, epoch_time_s: float, eval_time_s: float,
) -> EpochMetrics:
    """An epoch's metrics from its sums over `steps` batches of `batch_size` examples.

    Raises NanLoss when the training loss is not a finite number."""
    metrics = EpochMetrics(
        epoch=epoch,
        train_loss=loss_sum / steps,
        train_accuracy=correct / (steps * batch_size),
        test_loss=test_loss,
        test_accuracy=test_accuracy,
        epoch_time_s=epoch_time_s,
        eval_time_s=eval_time_s,
        samples_per_s=steps * batch_size / epoch_time_s,
    )
    check_finite(metrics)
    return metrics


def steady_epoch_s(epoch_times: Sequence[float]) -> float:
    """Median of epochs 2..n in seconds, leaving out the first (warm-up); the first when alone."""
    return statistics.median(epoch_times[1:]) if len(epoch_times) > 1 else epoch_times[0]


def fit_timings(setup_s: float, compile_s: float, compilations: int, metrics: Sequence[EpochMetrics]) -> dict:
    """The `FitResult.timings` dict, in seconds, from the setup/compile times and the epochs."""
    epoch_times = [m.epoch_time_s for m in metrics]
    return {
        "setup_s": setup_s,
        "compile_s": compile_s,
        "first_epoch_s": epoch_times[0],
        "steady_epoch_s": steady_epoch_s(epoch_times),
        "train_s": sum(epoch_times),
        "eval_s": sum(m.eval_time_s for m in metrics),
        "compilations": compilations,
    }


WEIGHTS_FILE = "weights.safetensors"
METRICS_FILE = "metrics.json"
SPEC_FILE = "spec.json"


def write_common_artifacts(
    workdir: Path, weights: Weights, metrics: Sequence[EpochMetrics], spec: JobSpec
) -> list[str]:
    """Write weights.safetensors, metrics.json and spec.json into `workdir`; return their names.

    weights.safetensors holds `weights` (float32, PyTorch names and shapes) whichever framework
    trained them; metrics.json is the list of per-epoch metrics; spec.json the normalised spec.
    """
    workdir = Path(workdir)
    tensors = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in weights.items()}
    # "format": "pt" tells safetensors-aware loaders that the names follow PyTorch's layout.
    save_file(tensors, workdir / WEIGHTS_FILE, metadata={"format": "pt", "framework": spec.framework})
    (workdir / METRICS_FILE).write_text(json.dumps([m.to_dict() for m in metrics], indent=2))
    (workdir / SPEC_FILE).write_text(spec.model_dump_json(indent=2))
    return [WEIGHTS_FILE, METRICS_FILE, SPEC_FILE]


def read_weights(path: Path) -> Weights:
    """Read a weights.safetensors file into numpy arrays keyed by PyTorch-style names."""
    return load_file(str(path))
