"""Framework-neutral pieces both trainers share: initial weights, batch order, timings, artifacts.

Weights are numpy arrays named and shaped as PyTorch names them (`layers.0.weight` [out, in],
`layers.0.bias` [out], ..., `layers.k` the output layer), so a JAX job and a PyTorch job with
the same spec start from the same weights, see the same batches and write the same files.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from trainers import reference
from trainers.base import FINITE_METRICS, EpochMetrics, check_finite, check_finite_weights
from trainers.data import Dataset
from trainers.layers import Layer, plan_for
from trainers.presets import layers_of
from trainers.spec import JobSpec, ModelSpec, OptimizerSpec, model_plan

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


def image_shape(input_shape: int | Sequence[int]) -> tuple[int, int, int]:
    """(height, width, channels) of a cnn's input: `input_shape` [H, W, C] as it is, or a flat
    feature count read as a square one-channel image (784 -> 28x28x1), as weights files imply."""
    if isinstance(input_shape, int):
        side = math.isqrt(input_shape)
        return side, side, 1
    if len(input_shape) != 3:
        raise ValueError(f"a cnn needs images [H, W, C], not input shape {list(input_shape)}")
    height, width, channels = input_shape
    return height, width, channels


def init_weights(model: ModelSpec, input_shape: int | Sequence[int], num_classes: int, seed: int) -> Weights:
    """Initial weights of the model `model` describes (its layer list, a preset's expanded), in
    PyTorch's names and shapes, for inputs of `input_shape` ([D], [H, W, C], or a feature count:
    layers.plan_for) and `num_classes` outputs (1 for regression): reference.init's draws from
    np.random.default_rng(seed), in the list's order. The seeds' MLP is exactly `init_params`."""
    return reference.init(plan_for(layers_of(model, num_classes), input_shape, num_classes), seed)


def output_width(weights: Weights) -> int:
    """A model's output width: the rows of its last top-level dense layer (`layers.i.weight`)."""
    dense = [name for name in weights if name.startswith("layers.") and name.endswith(".weight")]
    if not dense:
        raise ValueError("these weights have no dense layer (layers.i.weight) to give the outputs")
    return int(weights[max(dense, key=lambda name: int(name.split(".")[1]))].shape[0])


def describe(weights: Weights) -> dict:
    """The model stored in `weights` (any model `init_weights` makes), read from names and shapes:
    {"name": "mlp"|"cnn", "in_features", "channels", "hidden_sizes", "num_classes", "batch_norm"}.
    `in_features` is None for a cnn (its input side is not stored). Raises ValueError otherwise."""

    def count(group: str) -> int:
        return sum(1 for name in weights if name.startswith(f"{group}.") and name.endswith(".weight"))

    convs, layers = count("convs"), count("layers")
    batch_norm = count("norms") + count("conv_norms") > 0
    expected = {f"layers.{i}.{kind}" for i in range(layers) for kind in ("weight", "bias")}
    expected |= {f"convs.{i}.{kind}" for i in range(convs) for kind in ("weight", "bias")}
    if batch_norm:
        norm_kinds = ("weight", "bias", "running_mean", "running_var")
        expected |= {f"norms.{i}.{kind}" for i in range(layers - 1) for kind in norm_kinds}
        expected |= {f"conv_norms.{i}.{kind}" for i in range(convs) for kind in norm_kinds}
    if layers == 0 or set(weights) != expected:
        raise ValueError(f"not the weights of a trainhub model: expected {sorted(expected)}, got {sorted(weights)}")
    dense = [weights[f"layers.{i}.weight"].shape for i in range(layers)]
    return {
        "name": "cnn" if convs else "mlp",
        "in_features": None if convs else dense[0][1],
        "channels": [weights[f"convs.{i}.weight"].shape[0] for i in range(convs)],
        "hidden_sizes": [out for out, _ in dense[:-1]],
        "num_classes": dense[-1][0],
        "batch_norm": batch_norm,
    }


def forward(
    weights: Weights, x: np.ndarray, input_shape: Sequence[int] | None = None, layers: Sequence[Layer] | None = None
) -> np.ndarray:
    """Outputs float32 [N, outputs] (logits, or the predicted value) of the model in `weights` (eval
    mode: batch norm uses its running statistics, no dropout) for flat inputs x [N, D], in numpy:
    the reference both frameworks' models are checked against. The model is `layers` (spec.json's
    model.layers), or the preset the weights' names and shapes say; image layers read the input
    as `input_shape` [H, W, C] (default: square, one channel)."""
    if layers is None:
        info = describe(weights)
        spec = ModelSpec.model_construct(
            name=info["name"],
            hidden_sizes=info["hidden_sizes"],
            channels=info["channels"] or [1],
            batch_norm=info["batch_norm"],
            dropout=0.0,
        )
        layers = layers_of(spec, info["num_classes"])
    shape = tuple(input_shape) if input_shape is not None else int(x.shape[1])
    return reference.forward(plan_for(list(layers), shape, output_width(weights)), weights, x)


BATCH_NORM_EPS = 1e-5  # PyTorch's default, used by both frameworks
BATCH_NORM_MOMENTUM = 0.1  # PyTorch's convention: running = (1 - m) * running + m * batch


def learning_rate_at(optimizer: OptimizerSpec, step: int, steps_per_epoch: int, epochs: int) -> float:
    """The learning rate of optimizer step `step` (counting from 0) under `optimizer.schedule`; the
    formulas are OptimizerSpec's. The reference the optax and torch schedules are tested against."""
    lr = optimizer.learning_rate
    total = epochs * steps_per_epoch
    warmup = optimizer.warmup_epochs * steps_per_epoch if optimizer.schedule == "warmup_cosine" else 0
    if optimizer.schedule == "constant":
        return lr
    if step < warmup:
        return lr * step / warmup
    progress = min(step - warmup, total - warmup) / (total - warmup)
    return lr * 0.5 * (1.0 + math.cos(math.pi * progress))


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


def test_metrics(task: str, loss: float, score: float, target_variance: float | None = None) -> dict[str, float | None]:
    """EpochMetrics' test fields from an evaluation's mean `loss` and mean `score`: for
    classification the cross-entropy and the accuracy; for regression the squared error and the
    absolute error, giving MSE, RMSE, MAE and R^2 = 1 - MSE / `target_variance` (the test targets'
    population variance; R^2 is None when it is 0 or not given)."""
    if task == "classification":
        return {"test_loss": loss, "test_accuracy": score}
    r2 = 1.0 - loss / target_variance if target_variance else None
    return {"test_loss": loss, "test_accuracy": None, "test_rmse": math.sqrt(loss), "test_mae": score, "test_r2": r2}


def target_variance(y: np.ndarray) -> float:
    """The population variance of regression targets y [N], in float64 (R^2's denominator)."""
    return float(np.var(np.asarray(y, dtype=np.float64))) if len(y) else 0.0


def summarize_epoch(
    epoch: int,
    *,
    loss_sum: float,
    correct: float,
    steps: int,
    batch_size: int,
    test: dict[str, float | None],
    epoch_time_s: float,
    eval_time_s: float,
    learning_rate: float | None = None,
    evaluated: bool = True,
    task: str = "classification",
) -> EpochMetrics:
    """An epoch's metrics from its sums over `steps` batches of `batch_size` examples (`correct`:
    right predictions; not reported for regression) and the test fields (`test_metrics`).

    Raises NanLoss when a loss, accuracy or score is not a finite number (the training ones only
    when not `evaluated`: a data parallel rank other than 0 has no test metrics)."""
    metrics = EpochMetrics(
        epoch=epoch,
        train_loss=loss_sum / steps,
        train_accuracy=correct / (steps * batch_size) if task == "classification" else None,
        test_loss=test["test_loss"],  # type: ignore[arg-type]  # test_metrics always sets it
        test_accuracy=test.get("test_accuracy"),
        epoch_time_s=epoch_time_s,
        eval_time_s=eval_time_s,
        samples_per_s=steps * batch_size / epoch_time_s,
        learning_rate=learning_rate,
        test_rmse=test.get("test_rmse"),
        test_mae=test.get("test_mae"),
        test_r2=test.get("test_r2"),
    )
    check_finite(metrics, FINITE_METRICS if evaluated else ("train_loss", "train_accuracy"))
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


def final_result(last: EpochMetrics, first_step_loss: float) -> dict[str, float]:
    """FitResult.result: the last epoch's test metrics the task has, and the first step's loss."""
    names = ("test_loss", "test_accuracy", "test_rmse", "test_mae", "test_r2")
    scores = {name: getattr(last, name) for name in names if getattr(last, name) is not None}
    return {**scores, "first_step_loss": first_step_loss}


@dataclass(frozen=True)
class Preprocessing:
    """What turns a raw example into the model's input, written to preprocessing.json so that
    downloaded weights reproduce the reported metrics:

        x = raw.reshape(N, -1).astype(float32) * scale      # images: (row, column, channel) order
        x = (x - mean) / where(std > 0, std, 1)             # when standardize

    input_shape: one raw example's shape ([D] or [H, W, C]); scale: 1/255 for uint8 images, 1 for
    tables; mean, std: float32 [D] of the training examples (None when not standardized)."""

    input_shape: tuple[int, ...]
    scale: float
    mean: np.ndarray | None
    std: np.ndarray | None

    @classmethod
    def of(cls, data: Dataset) -> Preprocessing | None:
        """The preprocessing of an uploaded or standardized dataset; None for a built-in one as
        is (its inputs are the raw values scaled to [0, 1], as documented in trainers/data.py)."""
        if data.mean is None and not data.uploaded:
            return None
        return cls(data.input_shape, data.scale, data.mean, data.std)

    def to_json(self) -> dict:
        standardized = self.mean is not None and self.std is not None
        return {
            "input_shape": list(self.input_shape),
            "scale": self.scale,
            "standardize": standardized,
            "mean": self.mean.tolist() if standardized else None,  # type: ignore[union-attr]
            "std": self.std.tolist() if standardized else None,  # type: ignore[union-attr]
        }


WEIGHTS_FILE = "weights.safetensors"
METRICS_FILE = "metrics.json"
SPEC_FILE = "spec.json"
PREPROCESSING_FILE = "preprocessing.json"


def _sort_metadata(path: Path) -> None:
    """Rewrite the safetensors file's `__metadata__` in sorted order, in place. safetensors writes
    it in hash-map order, a new one at each save, so identical weights would get another sha256
    each time. The header keeps its length (the same pairs, serialised alike) and is written over
    in place; where it would not, the file is written again with the new header (padded with
    spaces to 8 bytes, as safetensors pads it: the tensors' offsets count from its end)."""
    with path.open("r+b") as file:
        size = int.from_bytes(file.read(8), "little")
        raw = file.read(size)
        header = json.loads(raw)
        header["__metadata__"] = dict(sorted(header.get("__metadata__", {}).items()))
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
        if len(text) == len(raw.rstrip(b" ")):
            file.seek(8)
            file.write(text)
            return
        tensors = file.read()
        text += b" " * (-len(text) % 8)
        file.seek(0)
        file.write(len(text).to_bytes(8, "little") + text + tensors)
        file.truncate()


def write_common_artifacts(
    workdir: Path,
    weights: Weights,
    metrics: Sequence[EpochMetrics],
    spec: JobSpec,
    preprocessing: Preprocessing | None = None,
) -> list[str]:
    """Write weights.safetensors, metrics.json, spec.json (and preprocessing.json when given) into
    `workdir`; return their names.

    weights.safetensors holds `weights` (float32, PyTorch names and shapes) whichever framework
    trained them; metrics.json is the list of per-epoch metrics; spec.json the normalised spec.
    Raises NanLoss (nothing written) when a weight or batch norm statistic is not finite.
    """
    check_finite_weights(weights, metrics[-1].epoch if metrics else 0)
    workdir = Path(workdir)
    # The plan's order, so the file lists the tensors alike whichever framework wrote it (user
    # code has no plan: its module's own order).
    user_code = spec.model.user_code
    order = {} if user_code else {name: i for i, name in enumerate(model_plan(spec).param_shapes())}
    ordered = sorted(weights.items(), key=lambda item: order.get(item[0], len(order)))
    tensors = {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in ordered}
    # "format": "pt" tells safetensors-aware loaders that the names follow PyTorch's layout; the
    # model's layer list and input shape let the loaders build it from the file alone.
    metadata = {"format": "pt", "framework": spec.framework}
    if user_code:  # no layer list: the code's id and entrypoint say what builds it
        metadata["trainhub_user_code"] = json.dumps({"code": spec.model.code, "entrypoint": spec.model.entrypoint})
    else:
        metadata[MODEL_METADATA] = model_metadata(spec)
    save_file(tensors, workdir / WEIGHTS_FILE, metadata=metadata)
    _sort_metadata(workdir / WEIGHTS_FILE)
    (workdir / METRICS_FILE).write_text(json.dumps([m.to_dict() for m in metrics], indent=2, allow_nan=False))
    (workdir / SPEC_FILE).write_text(spec.model_dump_json(indent=2))
    if preprocessing is None:
        return [WEIGHTS_FILE, METRICS_FILE, SPEC_FILE]
    (workdir / PREPROCESSING_FILE).write_text(json.dumps(preprocessing.to_json(), allow_nan=False))
    return [WEIGHTS_FILE, METRICS_FILE, SPEC_FILE, PREPROCESSING_FILE]


def read_weights(path: Path) -> Weights:
    """Read a weights.safetensors file into numpy arrays keyed by PyTorch-style names."""
    return load_file(str(path))


MODEL_METADATA = "trainhub_model"


def model_metadata(spec: JobSpec) -> str:
    """JSON of {"layers": the model's layer list, "input_shape": one example's shape}, for the
    weights file's metadata."""
    walked = model_plan(spec)
    layers = layers_of(spec.model, walked.outputs)
    body = {"layers": [layer.model_dump(mode="json") for layer in layers], "input_shape": list(walked.input_shape)}
    return json.dumps(body, sort_keys=True)


def read_model(path: Path) -> tuple[list[Layer] | None, tuple[int, ...] | None]:
    """(layer list, input shape) a weights file says it holds; (None, None) for a file written
    before files said (a preset: its names and shapes say which)."""
    from pydantic import TypeAdapter
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        raw = (f.metadata() or {}).get(MODEL_METADATA)
    if raw is None:
        return None, None
    body = json.loads(raw)
    return TypeAdapter(list[Layer]).validate_python(body["layers"]), tuple(body["input_shape"])
