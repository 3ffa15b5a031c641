"""Why a job failed: the closed list of `error.type` values, what each means and what to do about
it, which ones a deployment may retry (TRAINHUB_RETRY_POLICY), and how an exception becomes one.

A failed job's `error` is {"type": a FailureType, "message": for the job's user, "reason": a finer
cause or absent}, e.g. {"type": "data_error", "reason": "data_not_found", "message": "..."}. The
message says what to change; it never carries SQL, a stack trace or a server path (an `internal`
failure shows only a reference to the worker's log).

Kept free of framework and database imports: exceptions are recognised by class name (the API
never imports jax or torch, and the workers' own exceptions live in workers/), so this module is
the one list the workers, the API, the events, the dashboard and the README follow.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from enum import StrEnum


class FailureType(StrEnum):
    NAN_LOSS = "nan_loss"
    OUT_OF_MEMORY = "out_of_memory"
    HARDWARE_MISMATCH = "hardware_mismatch"
    WORKER_LOST = "worker_lost"
    TIMEOUT = "timeout"
    DATA_ERROR = "data_error"
    INVALID_SPEC = "invalid_spec"
    USER_CODE_ERROR = "user_code_error"
    INTERNAL = "internal"


@dataclass(frozen=True)
class FailureClass:
    """What a failure type means, what its user can do, and whether a retry policy may name it
    (`not_retryable`: why not, when it may not: a retry would fail the same way)."""

    means: str
    to_do: str
    not_retryable: str | None = None

    @property
    def retryable(self) -> bool:
        return self.not_retryable is None


CLASSES: dict[FailureType, FailureClass] = {
    FailureType.NAN_LOSS: FailureClass(
        "a loss, an accuracy or the trained weights stopped being finite numbers (NaN or infinity)",
        "lower optimizer.learning_rate, add optimizer.clip_norm, or check the data for NaN values",
        "training is deterministic for a spec and seed: a retry diverges at the same step",
    ),
    FailureType.OUT_OF_MEMORY: FailureClass(
        "the job ran out of memory: host memory (reason host) or the accelerator's (reason device)",
        "lower batch_size, use a smaller model, or train on fewer examples (dataset.train_limit)",
    ),
    FailureType.HARDWARE_MISMATCH: FailureClass(
        "the worker's framework does not see the hardware (or the number of devices) the job asks for",
        "send the job to hardware the fleet has (GET /workers lists it), or ask its operators to fix the worker",
    ),
    FailureType.WORKER_LOST: FailureClass(
        "the worker running the job stopped beating its heartbeat (killed, crashed, lost its host) "
        "more times than the retry policy allows",
        "submit the job again; if it keeps happening, its operators find the worker in GET /workers",
    ),
    FailureType.TIMEOUT: FailureClass(
        "the job ran longer than its max_runtime_s",
        "raise max_runtime_s (up to the server's TRAINHUB_MAX_RUNTIME_S), or ask for fewer epochs",
        "a retry would run past the max_runtime_s the spec set",
    ),
    FailureType.DATA_ERROR: FailureClass(
        "the job's data could not be read: not found and not downloadable (reason data_not_found), "
        "a stored copy that is damaged (dataset_corrupt) or unreadable (dataset_unreadable)",
        "follow the message: install or upload the data again",
    ),
    FailureType.INVALID_SPEC: FailureClass(
        "the stored spec cannot run on the worker: it no longer validates there (spec_invalid), or "
        "the model does not fit the data's shape (model_does_not_fit)",
        "fix the field the message names and submit the job again",
        "the stored spec does not change: a retry fails the same way",
    ),
    FailureType.USER_CODE_ERROR: FailureClass(
        "the job's own model code (POST /code) raised, or its child process broke a limit (memory, file "
        "size, CPU time) or sent the worker something it refused",
        "fix the code: the message has the exception and your frames of its traceback, logs.txt what it printed",
        "the code does not change: a retry fails the same way",
    ),
    FailureType.INTERNAL: FailureClass(
        "anything else: a fault of the service, not of the job",
        "submit the job again; if it persists, give the service's operators the reference in the message",
    ),
}


@dataclass(frozen=True)
class Failure:
    """One failure as a job shows it (its `error`)."""

    type: FailureType
    message: str
    reason: str | None = None

    def as_error(self) -> dict:
        """The job's `error` object (no `reason` key when there is none)."""
        error = {"type": self.type.value, "message": self.message}
        return error | {"reason": self.reason} if self.reason else error


class SpecNotRunnable(Exception):
    """The stored spec does not validate on this worker (e.g. a worker older or newer than the API
    that accepted it); `str()` names the field and why."""


# Exceptions a job's user can act on, by class name, with their finer cause; shown with their own
# message (which their classes write for the user).
_BY_NAME: dict[str, tuple[FailureType, str | None]] = {
    "NanLoss": (FailureType.NAN_LOSS, None),
    "HardwareMismatch": (FailureType.HARDWARE_MISMATCH, None),
    "DataNotFound": (FailureType.DATA_ERROR, "data_not_found"),
    "DatasetCorrupt": (FailureType.DATA_ERROR, "dataset_corrupt"),
    "SpecNotRunnable": (FailureType.INVALID_SPEC, "spec_invalid"),
    "UserCodeFailed": (FailureType.USER_CODE_ERROR, None),  # workers/user_code.py: the user's frames
}
# Words of an out-of-memory error raised as a plain RuntimeError: XLA's status (jaxlib's
# XlaRuntimeError, JaxRuntimeError), PyTorch's allocators (older CUDA builds, the CPU allocator,
# and a DDP rank's report as trainers/torch_ddp.py forwards it).
_OOM_WORDS = ("resource_exhausted", "out of memory", "can't allocate memory")
# Types an older worker wrote, as the closed list names them (app/migrations 0020 rewrites
# stored rows; this covers an old worker still running during an upgrade).
_LEGACY = {
    "data_not_found": (FailureType.DATA_ERROR, "data_not_found"),
    "dataset_corrupt": (FailureType.DATA_ERROR, "dataset_corrupt"),
}


def classify(exc: BaseException, hardware: str = "cpu") -> Failure | None:
    """The failure `exc` is for a job on `hardware`, or None when it is none the user can act on
    (the caller reports it as `internal`, with a reference to its log)."""
    for cause in _chain(exc):
        name = type(cause).__name__
        if name in _BY_NAME:
            kind, reason = _BY_NAME[name]
            return Failure(kind, str(cause), reason)
        if name == "LayerError":  # trainers/layers.py: a layer cannot take its input's shape
            return Failure(
                FailureType.INVALID_SPEC,
                f"the model does not fit the data: {cause}; change the model (GET /models/presets lists "
                "the presets' layers)",
                "model_does_not_fit",
            )
        if name == "BadDatasetFile":  # its text may name a server path: the log has it
            return Failure(
                FailureType.DATA_ERROR,
                "the stored copy of the dataset cannot be read as a dataset file; upload the dataset again",
                "dataset_unreadable",
            )
        if (where := out_of_memory(cause, hardware)) is not None:
            return Failure(FailureType.OUT_OF_MEMORY, _oom_message(cause, where, hardware), where)
    return None


def out_of_memory(exc: BaseException, hardware: str = "cpu") -> str | None:
    """Which memory `exc` says the job ran out of: "host", "device", or None when it is no such error.

    Recognised: Python's MemoryError (host); torch.cuda.OutOfMemoryError / torch.OutOfMemoryError
    (device); a RuntimeError (XLA's XlaRuntimeError, JaxRuntimeError, PyTorch's allocators) whose
    message says RESOURCE_EXHAUSTED or out of memory: device memory, but host memory on cpu."""
    if isinstance(exc, MemoryError):
        return "host"
    if type(exc).__name__ == "OutOfMemoryError":
        return "device" if hardware != "cpu" else "host"
    if isinstance(exc, RuntimeError) and any(word in str(exc).lower() for word in _OOM_WORDS):
        return "device" if hardware != "cpu" else "host"
    return None


def timeout(max_runtime_s: float | None) -> Failure:
    return Failure(
        FailureType.TIMEOUT,
        f"the job ran longer than max_runtime_s={max_runtime_s}; raise max_runtime_s or ask for fewer epochs",
    )


def internal(reference: str) -> Failure:
    return Failure(
        FailureType.INTERNAL,
        f"the job stopped on an internal error; the service's operators find its details in the worker's "
        f"log under reference {reference}",
    )


def normalise(error: Mapping | None) -> dict | None:
    """A stored `error` in the closed list's terms: an older worker's type becomes its class (with
    the old type as `reason`), and a type outside the list becomes `internal`."""
    if error is None:
        return None
    kind = error.get("type")
    if kind in FailureType.__members__.values():
        return dict(error)
    known, reason = _LEGACY.get(str(kind), (FailureType.INTERNAL, str(kind) if kind else None))
    return {**error, "type": known.value} | ({"reason": reason} if reason and not error.get("reason") else {})


# The retry policy: failure type -> how many times a job failing with it goes back to its queue.
RetryPolicy = dict[FailureType, int]
MAX_RETRIES = 10  # per type: beyond it a job is failing, not unlucky
# What a deployment retries when TRAINHUB_RETRY_POLICY does not say (TRAINHUB_MAX_ATTEMPTS=3 before it).
DEFAULT_RETRIES: RetryPolicy = {FailureType.WORKER_LOST: 2}


def parse_policy(value: object) -> RetryPolicy:
    """TRAINHUB_RETRY_POLICY ("worker_lost=2,out_of_memory=1", or a mapping) as {type: retries}.

    Raises ValueError naming the setting: an unknown type, one that may not be retried (a retry
    would fail the same way), a count that is not a whole number in 0..MAX_RETRIES, a type twice."""
    if isinstance(value, Mapping):
        items = [(str(k), v) for k, v in value.items()]
    elif isinstance(value, str):
        entries = [entry.strip() for entry in value.split(",") if entry.strip()]
        if bad := [entry for entry in entries if entry.count("=") != 1]:
            raise ValueError(
                f"TRAINHUB_RETRY_POLICY: {bad[0]!r} is not TYPE=COUNT (e.g. worker_lost=2,out_of_memory=1)"
            )
        items = [(k.strip(), v.strip()) for k, v in (entry.split("=") for entry in entries)]
    else:
        raise ValueError("TRAINHUB_RETRY_POLICY: write it as TYPE=COUNT pairs, e.g. worker_lost=2,out_of_memory=1")
    policy: RetryPolicy = {}
    for name, count in items:
        if name not in FailureType.__members__.values():
            choices = ", ".join(kind for kind, known in CLASSES.items() if known.retryable)
            raise ValueError(f"TRAINHUB_RETRY_POLICY: {name!r} is not a failure type; choose from {choices}")
        kind = FailureType(name)
        if (why := CLASSES[kind].not_retryable) is not None:
            raise ValueError(f"TRAINHUB_RETRY_POLICY: {name} cannot be retried: {why}")
        if kind in policy:
            raise ValueError(f"TRAINHUB_RETRY_POLICY: {name} is given twice")
        try:
            retries = int(str(count))
        except ValueError:
            retries = -1
        if not 0 <= retries <= MAX_RETRIES:
            raise ValueError(
                f"TRAINHUB_RETRY_POLICY: {name}={count} needs a whole number of retries from 0 to {MAX_RETRIES}"
            )
        policy[kind] = retries
    return policy


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc`, then what caused it (raise ... from, or the exception being handled), a few deep."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 8:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def _oom_message(exc: BaseException, where: str, hardware: str) -> str:
    # The framework's first line says how much it tried to allocate; a line naming a file is left out.
    first = (str(exc).strip().splitlines() or [""])[0][:200]
    said = f" ({first})" if first and "/" not in first else ""
    memory = "host memory" if where == "host" else f"{hardware} device memory"
    return f"the job ran out of {memory}{said}; {CLASSES[FailureType.OUT_OF_MEMORY].to_do}"
