"""The contract both trainers keep: a whole run in, per-epoch reports and a result out."""

from __future__ import annotations

import importlib
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from trainers.spec import JobSpec
from trainers.user_code import UserModel


@dataclass
class EpochMetrics:
    """One epoch's numbers; times in seconds.

    Losses are the task's: mean cross-entropy in nats (classification) or mean squared error in
    the target's units squared (regression). Accuracies are for classification (None for
    regression); `test_rmse`, `test_mae` (the target's units) and `test_r2` (coefficient of
    determination, 1 - MSE / variance of the test targets; None when they are constant) for
    regression (None for classification).

    `epoch_time_s` covers the training steps of the epoch only (waited for on the device);
    `eval_time_s` the evaluation on the test split that follows it. `learning_rate` is the rate
    the optimizer used for the epoch's first step, read from the framework's own schedule
    (optax's, or torch.optim's param group); None in metrics stored before it existed.
    """

    epoch: int
    train_loss: float
    train_accuracy: float | None
    test_loss: float
    test_accuracy: float | None
    epoch_time_s: float
    eval_time_s: float
    samples_per_s: float
    learning_rate: float | None = None  # the optimizer's rate at the epoch's first step
    test_rmse: float | None = None
    test_mae: float | None = None
    test_r2: float | None = None

    def to_dict(self) -> dict:
        return asdict(self)


# The one list of an epoch's metric names: the database columns, the HTTP schema and the events
# follow it.
METRIC_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(EpochMetrics))


@dataclass
class FitResult:
    """What `fit` returns.

    timings (seconds): setup_s (data and model ready), compile_s (trace and compile of the train
    step; 0 for eager PyTorch), first_epoch_s, steady_epoch_s (median of epochs 2..n, or the
    first epoch when there is only one), train_s (sum of epoch_time_s), eval_s (sum of
    eval_time_s); plus `compilations`, the number of XLA programs built (compiled, or loaded
    from the persistent compilation cache) for the train step during the run: 1 for a JAX job
    whose step never retraces, 0 for eager PyTorch.
    artifacts: file names written to the workdir, e.g. weights.safetensors.
    device: {"backend": "cpu", "devices": ["cpu:0"], "versions": {"jax": "0.10.2"}}.
    """

    metrics: list[EpochMetrics]
    timings: dict[str, float]
    result: dict[str, float]
    artifacts: list[str]
    device: dict = field(default_factory=dict)


class StopTraining(Exception):
    """Raised by a `report` or `should_stop` hook to end the run early (cancel, time limit).

    The trainer lets it propagate after the current chunk of steps; metrics already reported
    stay reported. `reason` is a short machine word such as "cancelled" or "timeout"; with one of
    HAND_BACK_REASONS the trainer first checkpoints where the epoch stands (see there).
    """

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(message or reason)
        self.reason = reason


HAND_BACK_REASONS = frozenset({"preempted", "shutdown"})
"""StopTraining reasons after which the same job runs again later (its worker hands it back to the
queue): before letting one propagate between two chunks of an epoch, a trainer checkpoints the
state and where the epoch stands, and the next `fit` in the workdir continues from that step with
the results an uninterrupted run has. Other reasons end the job: the last checkpoint stays."""


class HardwareMismatch(Exception):
    """The spec asks for hardware (gpu, tpu) the framework does not see in this process.

    Raised before any training, so a job never silently falls back to the CPU.
    """

    def __init__(self, requested: str, found: str, framework: str) -> None:
        super().__init__(
            f"job asks for hardware {requested!r} but {framework} in this worker only sees {found!r}; "
            f"send it to a {requested} worker"
        )
        self.requested = requested
        self.found = found


class NanLoss(Exception):
    """A metric or the trained weights stopped being finite numbers (NaN or infinity).

    `epoch`: the epoch where it happened; `metric`: which number (`train_loss`, `test_loss`, ...
    or `weights`); `value`: what it became."""

    def __init__(self, epoch: int, value: float, metric: str = "train_loss") -> None:
        super().__init__(
            f"{metric} became {value} in epoch {epoch}; lower optimizer.learning_rate "
            "(or add optimizer.clip_norm, or check the data for NaN values)"
        )
        self.epoch = epoch
        self.metric = metric
        self.value = value


# The metrics that must be finite numbers (when the task has them); timings are measured, never diverge.
FINITE_METRICS = ("train_loss", "train_accuracy", "test_loss", "test_accuracy", "test_rmse", "test_mae", "test_r2")


def check_finite(metrics: EpochMetrics, names: tuple[str, ...] = FINITE_METRICS) -> None:
    """Raise NanLoss naming the first of the epoch's metrics `names` (its losses, accuracies and
    regression scores, those the task has) that is NaN or infinite: JSON (the database,
    metrics.json, the API) has no such numbers, and a model that produces them has diverged."""
    for name in names:
        value = getattr(metrics, name)
        if value is not None and not math.isfinite(value):
            raise NanLoss(metrics.epoch, value, name)


def check_finite_weights(weights: dict, epoch: int) -> None:
    """Raise NanLoss when any array of `weights` (name -> numpy array: params and batch norm
    statistics) holds a NaN or infinity, naming the first such tensor."""
    import numpy as np

    for name, value in weights.items():
        if not np.isfinite(value).all():
            raise NanLoss(epoch, float(np.asarray(value)[~np.isfinite(value)].flat[0]), f"weights ({name})")


# Where a run keeps its checkpoint in its workdir (a job handed back resumes from it): PyTorch's
# file (trainers.torch_checkpoint), JAX's Orbax folder (trainers.jax_checkpoint). Named here, so
# a worker can find them without importing a framework.
CHECKPOINT_FILE = "checkpoint.pt"
CHECKPOINT_DIR = "checkpoints"
# PyTorch's checkpoint while it is written (fsync'd, then renamed over CHECKPOINT_FILE).
CHECKPOINT_PARTIAL = "checkpoint.partial"


def remove_checkpoint(workdir: Path) -> None:
    """Delete a run's checkpoint from `workdir` (an ended job never resumes: params and opt_state,
    about three times the weights with Adam): each of its names on its own, what is not there is
    fine, and a link is removed, never what it points to. Raises OSError (the first one met) after
    trying them all."""
    errors: list[OSError] = []
    for name in (CHECKPOINT_FILE, CHECKPOINT_PARTIAL, CHECKPOINT_DIR):
        path = workdir / name
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


# A host's compiled programs for a year of jobs of many shapes: within 2 GiB per framework (a
# program or a compiled step is ~0.1-5 MB), the least recently used leaving first.
COMPILE_CACHE_MAX_BYTES = 2 * 1024**3


@dataclass(frozen=True)
class RunOptions:
    """Where a run finds what lies outside its spec, passed by the caller (a worker fills it from
    its Settings), never read from the process environment.

    data_dir: MNIST-format data is looked for here first, and downloaded into it (None: only the
    OS location, downloads into ~/.cache/trainhub/data; see trainers/data.py).
    compile_cache_dir: the persistent compilation cache shared by a host's workers (None: none):
    JAX's programs, and PyTorch's compiled whole steps in its torch-steps/ (trainers.torch_step).
    compile_cache_max_bytes: each framework's part of compile_cache_dir is kept within this many
    bytes, the least recently used entries removed first (JAX's by its own LRU cache).
    dataset_file: an uploaded dataset the spec names by id, in trainers.dataset_file's form,
    fetched (and its sha256 checked) by the caller.
    user_model: a spec with user code (model.code): its loaded entrypoint (trainers.user_code),
    given only inside the job's child process.
    keep_programs: JAX: keep the run's compiled programs in the process for the next run of the
    same shape (jax_trainer.program_key), as a worker does; off, every run compiles its own (or
    loads it from the persistent cache), and its timings count that.
    """

    data_dir: Path | None = None
    compile_cache_dir: Path | None = None
    compile_cache_max_bytes: int = COMPILE_CACHE_MAX_BYTES
    dataset_file: Path | None = None
    user_model: UserModel | None = None
    keep_programs: bool = False


Report = Callable[[int, EpochMetrics], None]
"""Called once at the end of each epoch with (epoch, metrics); epochs count from 1."""

ShouldStop = Callable[[], None]
"""Called between chunks of steps; raises StopTraining to stop the run."""


def _never_stop() -> None:
    return None


_TRAINERS = {"jax": "trainers.jax_trainer", "pytorch": "trainers.torch_trainer"}


def fit(
    spec: JobSpec,
    workdir: Path,
    report: Report,
    should_stop: ShouldStop = _never_stop,
    options: RunOptions | None = None,
) -> FitResult:
    """Train `spec` with its framework, writing artifacts into `workdir`; `options` (RunOptions)
    say where the data and the compilation cache are.

    The framework module is imported here, on first use, so a process that never trains
    with a framework never imports it; the result's timings say how long that took (`import_s`,
    0 once the module was imported by an earlier run of the process).

    Raises HardwareMismatch when the framework does not see `spec.hardware`, DataNotFound
    when the dataset cannot be found, StopTraining when a hook stops the run, and whatever
    the framework raises otherwise.
    """
    start = time.perf_counter()
    module = importlib.import_module(_TRAINERS[spec.framework])
    import_s = time.perf_counter() - start
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    result = module.fit(spec, workdir, report, should_stop, options or RunOptions())
    if result.timings:  # (a data parallel rank other than 0 returns none)
        result.timings["import_s"] = import_s
    return result
