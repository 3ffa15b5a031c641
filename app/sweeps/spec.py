"""A sweep's request: a base job spec, a search space over its fields by dotted path, an
objective, a method, a budget, and optionally early stopping.

    {"base": {"framework": "jax", "dataset": {"name": "digits"}, "epochs": 6},
     "space": {"optimizer.learning_rate": {"log_uniform": [1e-4, 1e-1]},
               "batch_size": {"choice": [32, 64, 128]}},
     "objective": {"metric": "test_accuracy", "direction": "max"},
     "method": "tpe", "max_trials": 8, "parallelism": 2,
     "early_stopping": {"method": "asha", "min_epochs": 1}}

Each dimension is one of `uniform: [low, high]`, `log_uniform: [low, high]` (low > 0),
`int_uniform: [low, high]` (whole numbers, both ends included), `choice: [values]` or
`grid: [values]`. `method: "grid"` takes every combination of the values of `grid` and `choice`
dimensions once (no ranges); `random` and `tpe` sample (Optuna's RandomSampler and TPESampler).
Whether a path and its values are valid is checked against the job spec itself (app/sweeps/
validate.py): the same rules and server limits as `POST /jobs`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from app.schemas import Timestamp
from app.status import SweepStatus
from trainers.base import METRIC_FIELDS
from trainers.spec import Framework

MAX_TRIALS = 1000
MAX_DIMENSIONS = 16
MAX_CHOICES = 100
# Per-epoch metrics a sweep can optimise: the scores, not the timings.
OBJECTIVE_METRICS = tuple(name for name in METRIC_FIELDS if name.startswith(("train_", "test_")))

Scalar = Annotated[float, Field(allow_inf_nan=False)] | int | str | bool


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


# [low, high]
Range = Annotated[list[Annotated[float, Field(allow_inf_nan=False)]], Field(min_length=2, max_length=2)]
IntRange = Annotated[list[int], Field(min_length=2, max_length=2)]


class Dimension(_Strict):
    """One field's values to search: exactly one of the five kinds."""

    uniform: Range | None = None
    log_uniform: Range | None = None
    int_uniform: IntRange | None = None
    choice: Annotated[list[Scalar], Field(min_length=1, max_length=MAX_CHOICES)] | None = None
    grid: Annotated[list[Scalar], Field(min_length=1, max_length=MAX_CHOICES)] | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Dimension:
        given = [name for name in self.kinds() if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(
                "a dimension names exactly one of uniform, log_uniform, int_uniform, choice or grid, "
                f"e.g. {{'log_uniform': [0.0001, 0.1]}}; this one names {given or 'none'}"
            )
        kind = given[0]
        if kind in ("uniform", "log_uniform", "int_uniform"):
            low, high = getattr(self, kind)
            if not all(math.isfinite(v) for v in (low, high)) or not low < high:
                raise ValueError(f"{kind} needs [low, high] with low < high, both finite; got [{low}, {high}]")
            if kind == "log_uniform" and low <= 0:
                raise ValueError(f"log_uniform needs low > 0 (a logarithm of {low} is undefined); got [{low}, {high}]")
        else:
            values = getattr(self, kind)
            if len({repr(v) for v in values}) != len(values):
                raise ValueError(f"{kind} lists a value twice: {values}")
        return self

    @staticmethod
    def kinds() -> tuple[str, ...]:
        return ("uniform", "log_uniform", "int_uniform", "choice", "grid")

    @property
    def kind(self) -> str:
        return next(name for name in self.kinds() if getattr(self, name) is not None)

    def extremes(self) -> list[Any]:
        """The values that must each make a valid spec: a range's ends, every listed value."""
        return list(getattr(self, self.kind))

    def values(self) -> list[Any] | None:
        """The listed values (choice, grid); None for a range."""
        return getattr(self, self.kind) if self.kind in ("choice", "grid") else None


class Objective(_Strict):
    """The per-epoch metric a trial is judged by, and whether more is better."""

    metric: Literal[OBJECTIVE_METRICS] = "test_accuracy"  # type: ignore[valid-type]
    direction: Literal["max", "min"] = "max"


class EarlyStopping(_Strict):
    """Stop trials that do worse than the others at the same epoch (Optuna's pruners):
    `median` (MedianPruner: below the median of earlier trials at that epoch) or `asha`
    (SuccessiveHalvingPruner: only the best 1/reduction_factor of the trials go on at epochs
    min_epochs, min_epochs x reduction_factor, ...). No trial is stopped before `min_epochs`."""

    method: Literal["median", "asha"]
    min_epochs: Annotated[int, Field(ge=1, le=1000)] = 1
    reduction_factor: Annotated[int, Field(ge=2, le=10)] = 3


class SweepSpec(_Strict):
    """A hyperparameter search over a base job spec (see the module docstring)."""

    base: dict[str, Any] = Field(description="A job spec (as for POST /jobs) every trial starts from.")
    space: dict[str, Dimension] = Field(description="Dotted path of a spec field -> the values to search.")
    objective: Objective = Field(default_factory=Objective)
    method: Literal["grid", "random", "tpe"] = "tpe"
    max_trials: Annotated[int, Field(ge=1, le=MAX_TRIALS)] = 10
    parallelism: Annotated[int, Field(ge=1, le=100)] = 2
    max_total_s: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = Field(
        None, description="Budget: the trials' summed train time (seconds); no new trial starts past it."
    )
    early_stopping: EarlyStopping | None = None
    frameworks: Annotated[list[Framework], Field(min_length=1, max_length=2)] | None = Field(
        None,
        description="The frameworks every trial runs in (default: [base.framework]). Both: each trial is a "
        "comparison, judged by the mean of the two jobs' objectives.",
    )
    seed: Annotated[int, Field(ge=0, le=2**31 - 1)] = 0
    name: Annotated[str, Field(max_length=200)] | None = None

    @model_validator(mode="after")
    def _space_size(self) -> SweepSpec:
        if self.frameworks and len(set(self.frameworks)) != len(self.frameworks):
            raise ValueError(f"frameworks names one twice: {self.frameworks}; use ['jax', 'pytorch'] for both")
        if not self.space:
            raise ValueError(
                "space is empty: name at least one field to search, e.g. {'batch_size': {'choice': [32, 64]}}"
            )
        if len(self.space) > MAX_DIMENSIONS:
            raise ValueError(f"space has {len(self.space)} dimensions; at most {MAX_DIMENSIONS}")
        return self

    def grid_size(self) -> int:
        """How many trials `method: grid` runs: the product of the dimensions' value counts."""
        return math.prod(len(d.values() or ()) for d in self.space.values())


class Trial(BaseModel):
    """One trial: its number in the study, the values it set, its job (one per framework), and how
    it did. In both frameworks it is a comparison, its objective the mean of the two jobs'."""

    number: int
    params: dict[str, Any]
    job_id: str = Field(description="Its job (the first framework's when it runs in both).")
    jobs: dict[str, str] = Field(description="framework -> job id.")
    comparison_id: str | None = None
    status: str
    objective: float | None = Field(None, description="The objective at the trial's last recorded epoch.")
    epochs: int = Field(description="Epochs it ran (the fewest of its jobs').")
    pruned_at_epoch: int | None = None


class TrialCounts(BaseModel):
    queued: int = 0
    running: int = 0
    succeeded: int = 0
    pruned: int = 0
    failed: int = 0
    cancelled: int = 0


class Budget(BaseModel):
    """What the sweep has used of its budget: trials created, train seconds summed."""

    trials: int
    max_trials: int
    train_s: float
    max_total_s: float | None


class Sweep(BaseModel):
    """A sweep: its spec, status, trials by status, the best trial so far and the budget used."""

    id: str
    status: SweepStatus
    name: str | None
    spec: SweepSpec
    created_at: Timestamp
    finished_at: Timestamp | None
    trials: TrialCounts
    best: Trial | None = Field(None, description="The completed trial with the best objective.")
    best_spec: dict[str, Any] | None = Field(None, description="The job spec the best trial ran (its first job's).")
    budget: Budget


class TrialPage(BaseModel):
    items: list[Trial]


class SweepPage(BaseModel):
    items: list[Sweep]
    next_cursor: str | None = None
