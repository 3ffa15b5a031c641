"""HTTP schemas, built on the spec types of trainers/spec.py."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, Field, PlainSerializer

from app.failures import FailureType
from app.lifecycle import FINISHED, JobStatus
from app.models import rfc3339
from trainers.spec import ComparisonSpec, Framework, JobSpec

# Every time in an answer: UTC, RFC 3339 with a Z (a naive database value is UTC too).
Timestamp = Annotated[datetime, PlainSerializer(rfc3339, return_type=str)]

__all__ = [
    "ComparisonSpec",
    "Comparison",
    "JobSpec",
    "Job",
    "JobPage",
    "ArtifactInfo",
    "EpochMetrics",
    "JobStatus",
    "FINISHED",
]


class EpochMetrics(BaseModel):
    """One epoch: losses are mean cross-entropy in nats (classification) or mean squared error
    (regression), times in seconds. Accuracies are null for regression; test_rmse, test_mae and
    test_r2 are null for classification."""

    epoch: int
    train_loss: float
    train_accuracy: float | None
    test_loss: float
    test_accuracy: float | None
    epoch_time_s: float
    eval_time_s: float
    samples_per_s: float
    learning_rate: float | None = Field(None, description="The optimizer's learning rate at the epoch's first step.")
    test_rmse: float | None = Field(None, description="Regression: root mean squared error, the target's units.")
    test_mae: float | None = Field(None, description="Regression: mean absolute error, the target's units.")
    test_r2: float | None = Field(None, description="Regression: coefficient of determination (1 is perfect).")


class ArtifactInfo(BaseModel):
    name: str
    size_bytes: int
    sha256: str
    url: str


class Progress(BaseModel):
    epoch: int
    epochs: int


class JobError(BaseModel):
    """Why a job failed (or, as `last_error`, why it was retried): `type` is one of a closed list
    (the README's "Failure classes" says what each means and what to do), `reason` a finer cause
    where one helps (e.g. data_not_found for a data_error; host or device for out_of_memory)."""

    type: FailureType = Field(
        description="nan_loss, out_of_memory, hardware_mismatch, worker_lost, timeout, "
        "data_error, invalid_spec or internal."
    )
    message: str = Field(description="What happened and what to change, for the job's user.")
    reason: str | None = Field(None, description="A finer cause, e.g. data_not_found or dataset_corrupt.")


class ModelSummary(BaseModel):
    """What the spec's model is for its dataset: trainable parameters and forward FLOPs per example
    (2 x multiply-adds of dense and conv layers, one per value for the others)."""

    parameters: int
    flops_per_example: int


class TrialOf(BaseModel):
    """A trial's sweep, its number there and the values it set ({dotted path: value})."""

    id: str
    trial: int
    params: dict[str, Any]


class Pruned(BaseModel):
    epoch: int = Field(description="The last epoch it ran.")
    reason: str


class Job(BaseModel):
    """A job as stored: its spec, state, timings (seconds), metrics and artifacts."""

    id: str
    status: JobStatus
    # A spec stored by an earlier version that this one no longer accepts (a limit tightened, a
    # field renamed) is served as stored rather than failing the read.
    spec: JobSpec | dict[str, Any] = Field(
        union_mode="left_to_right",
        description="The job's spec, normalised with every default; a spec stored by an earlier version that no "
        "longer validates is served as stored.",
    )
    created_at: Timestamp
    started_at: Timestamp | None
    finished_at: Timestamp | None
    waiting_reason: str | None
    queue_position: int | None = Field(
        None,
        description="While queued: 1 for the next job of its queue <hardware>.<framework> (with .x<N> for a job "
        "on N devices), 2 for the one after...",
    )
    attempts: int
    preempted: int = Field(0, description="How many times a job of higher priority took its worker (it resumed).")
    progress: Progress
    metrics: list[EpochMetrics]
    timings: dict[str, float | int] | None = Field(
        description="Where the job's time went, in seconds (`*_s`), and `compilations`: how many "
        "programs its trainer compiled (an int; 0 when every one came from a cache)."
    )
    result: dict[str, float] | None
    error: JobError | None
    retries: int = Field(
        0,
        description="How many times a failure that the deployment's retry policy retries "
        "(TRAINHUB_RETRY_POLICY) sent the job back to its queue; it resumed from its checkpoint.",
    )
    last_error: JobError | None = Field(None, description="The failure of the latest retry (null when never retried).")
    artifacts: list[ArtifactInfo]
    worker: dict | None
    model: ModelSummary | None = None
    sweep: TrialOf | None = Field(None, description="The sweep this job is a trial of, when it is one.")
    pruned: Pruned | None = Field(None, description="Where and why the sweep's pruner stopped it (status pruned).")


class JobPage(BaseModel):
    """A page of jobs, newest first; pass `next_cursor` as `cursor` for the next page."""

    items: list[Job]
    next_cursor: str | None


class ComparisonRow(BaseModel):
    """One line of the side-by-side table; ratio = jax / pytorch (None when undefined)."""

    metric: str
    jax: float | None
    pytorch: float | None
    ratio: float | None


class ComparisonError(BaseModel):
    """What ended a comparison failed: a side's job error (`framework` says which, `type` from the
    jobs' closed list), or `parity_mismatch` (framework null) when both ran but disagree."""

    framework: Framework | None
    type: str
    message: str
    reason: str | None = None


class Comparison(BaseModel):
    """A spec trained in both frameworks. `table` is filled once both jobs succeeded and the
    parity check passed; when the runs disagree, `status` is failed and `error` says so."""

    id: str
    status: JobStatus
    spec: ComparisonSpec
    created_at: Timestamp
    jobs: dict[str, Job]
    table: list[ComparisonRow] | None
    parity: dict | None
    error: ComparisonError | None
    overlap_s: float | None = Field(
        None,
        description="Seconds both jobs were running at the same time (None until both started). "
        "When they ran at once on one host they shared its memory bandwidth, and maybe its cores, "
        "so their timings include that contention; 0 means they ran one after the other.",
    )


class ComparisonPage(BaseModel):
    """A page of comparisons, newest first; pass `next_cursor` as `cursor` for the next page."""

    items: list[Comparison]
    next_cursor: str | None


class Worker(BaseModel):
    """A worker as its last heartbeat describes it. `online` (it can take work) while `last_seen`
    is younger than `worker_timeout_s` and `broker_connected` (it reached the broker at that
    heartbeat); `current_job_id` is shown only when that job is the caller's (`busy`
    says whether it trains anything)."""

    name: str  # hostname:pid:instance for an admin key; a stable alias for a user key
    hostname: str | None  # for an admin key only
    hardware: str
    online: bool
    broker_connected: bool
    queues: list[str]
    devices: list[str]
    versions: dict[str, str]
    busy: bool
    current_job_id: str | None
    started_at: Timestamp
    last_seen: Timestamp


class QueueDepth(BaseModel):
    """A queue `<hardware>.<framework>` (`.x<N>` for jobs data parallel over N devices, served by
    workers owning at least N): jobs waiting on it (everyone's) and the online workers serving it."""

    name: str
    depth: int
    workers_online: int


class WorkerList(BaseModel):
    """The workers seen recently, online first, and every queue's depth."""

    workers: list[Worker]
    queues: list[QueueDepth]
