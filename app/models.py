"""Tables: API keys, jobs, per-epoch metrics, artifacts and worker heartbeats.

The job row is the source of truth for a job; the broker only carries its id.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy import false as sql_false
from sqlalchemy.engine.default import DefaultExecutionContext
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from app.queue import queue_name
from app.status import JobStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(moment: datetime) -> datetime:
    """`moment` with its UTC zone: SQLite hands back naive datetimes (every stored one is UTC)."""
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def rfc3339(moment: datetime) -> str:
    """`moment` in UTC, RFC 3339 with a `Z`: the one spelling of a time in every answer, event and file."""
    return aware(moment).astimezone(UTC).isoformat().replace("+00:00", "Z")


def new_id() -> str:
    return str(uuid.uuid4())


class Base(DeclarativeBase):
    pass


def _spec_retention_days(context: DefaultExecutionContext) -> int | None:
    """Job.retention_days of a row inserted without one: its spec's `retention_days`."""
    spec = context.get_current_parameters().get("spec") or {}
    return spec.get("retention_days")


class ApiKey(Base):
    """An API key. Only the sha256 of the secret is stored; `prefix` identifies it in listings."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    name: Mapped[str] = mapped_column(String(200))
    prefix: Mapped[str] = mapped_column(String(16))
    key_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # An admin key sees (and may cancel and download) every job and names every worker's job;
    # a user key only its own. Made with `trainhub keys create --admin`.
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sql_false())
    # The highest priority its jobs may ask for (trainers.spec.PRIORITIES); null: any.
    max_priority: Mapped[str | None] = mapped_column(String(8))
    # A scrape key reads the service-wide /metrics and nothing else (Prometheus' credential).
    scrape_only: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sql_false())
    # Webhooks (app/webhooks/): the URL its jobs' status changes go to when a spec names none, and
    # the secret their deliveries are signed with (kept, as it signs; shown once when made).
    webhook_url: Mapped[str | None] = mapped_column(String(2048))
    webhook_secret: Mapped[str | None] = mapped_column(String(100))
    webhook_secret_created_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # May upload model code and run jobs with it (keys create --allow-code, keys code); the
    # deployment must allow user code too (TRAINHUB_ALLOW_USER_CODE).
    allow_code: Mapped[bool] = mapped_column(Boolean, default=False, server_default=sql_false())


class Job(Base):
    """A training job. `status`: queued | running | succeeded | failed | cancelled."""

    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    # No index of its own: the indexes below that start with owner_id serve it (migration 0009,
    # which also gives the table fillfactor 85 on PostgreSQL, for HOT updates).
    owner_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED.value, index=True)
    framework: Mapped[str] = mapped_column(String(16))
    hardware: Mapped[str] = mapped_column(String(16))
    # Data parallel over this many devices of `hardware` (spec.devices); only a worker that owns
    # as many serves the job's queue.
    devices: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    spec: Mapped[dict] = mapped_column(JSON)
    epochs: Mapped[int] = mapped_column(Integer)
    epoch: Mapped[int] = mapped_column(Integer, default=0)  # epochs finished so far
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Indexed for retention (app/retention.py): the expired jobs are a range of it.
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    timings: Mapped[dict | None] = mapped_column(JSON)
    result: Mapped[dict | None] = mapped_column(JSON)
    error: Mapped[dict | None] = mapped_column(JSON)
    worker: Mapped[dict | None] = mapped_column(JSON)
    idempotency_key: Mapped[str | None] = mapped_column(String(200))
    # When its id was last handed to the broker; NULL until then (the broker was down), so the
    # reconciler knows which queued jobs still need a message.
    enqueued_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The uploaded dataset it trains on (spec.dataset.id): deleting one waits for its active jobs.
    dataset_id: Mapped[str | None] = mapped_column(String(40), index=True)
    # The uploaded model code it trains (spec.model.code): deleting it waits for its active jobs.
    code_id: Mapped[str | None] = mapped_column(String(40), index=True)
    # spec.retention_days (days kept after it ends; null: the server's), copied from the spec at
    # insert by whoever writes the row, so retention finds such jobs by index (0016).
    retention_days: Mapped[int | None] = mapped_column(Integer, default=_spec_retention_days)
    # Its place in its queue: the index of spec.priority in trainers.spec.PRIORITIES (0 low,
    # 1 normal, 2 high), and how many times a higher-priority job took its worker.
    priority: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    preempted: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Failures the retry policy sent back to the queue (app/failures.py): how many in all, how
    # many of each error.type ({type: n}, what the policy counts), and the latest one's `error`.
    retries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    retry_counts: Mapped[dict | None] = mapped_column(JSON)
    last_error: Mapped[dict | None] = mapped_column(JSON)
    # A sweep's trial: the sweep, the trial's number in its Optuna study, the values the trial
    # set ({dotted path: value}). (sweep_id, trial_number, framework) is unique: no trial twice.
    sweep_id: Mapped[str | None] = mapped_column(ForeignKey("sweeps.id"), index=True)
    trial_number: Mapped[int | None] = mapped_column(Integer)
    trial_params: Mapped[dict | None] = mapped_column(JSON)

    metrics: Mapped[list[EpochMetric]] = relationship(
        order_by="EpochMetric.epoch", cascade="all, delete-orphan", lazy="selectin"
    )
    artifacts: Mapped[list[Artifact]] = relationship(
        order_by="Artifact.name", cascade="all, delete-orphan", lazy="selectin"
    )

    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key", name="uq_jobs_owner_idempotency"),
        UniqueConstraint("sweep_id", "trial_number", "framework", name="uq_jobs_sweep_trial"),
        Index("ix_jobs_owner_id_created_at", "owner_id", "created_at"),  # a key's recent jobs (rate limit)
        # A key's jobs of a status, newest first (GET /jobs?status=), and its queued jobs (quota).
        Index("ix_jobs_owner_status_created", "owner_id", "status", "created_at"),
        # The queued jobs of a queue by priority and key, oldest first (app/scheduling.py: the
        # next job, and queue_position); only queued rows are indexed.
        Index(
            "ix_jobs_queued_by_owner",
            "hardware",
            "framework",
            "devices",
            "priority",
            "owner_id",
            "created_at",
            postgresql_where=text("status = 'queued'"),
            sqlite_where=text("status = 'queued'"),
        ),
        # The finished jobs with a retention of their own (app/retention.py); few rows, as they go.
        Index(
            "ix_jobs_own_retention",
            "finished_at",
            postgresql_where=text("retention_days IS NOT NULL"),
            sqlite_where=text("retention_days IS NOT NULL"),
        ),
        # A key's latest claim in a queue (app/scheduling.py: who was served longest ago).
        Index("ix_jobs_owner_queue_started", "owner_id", "hardware", "framework", "devices", "started_at"),
    )

    @property
    def queue(self) -> str:
        """The broker queue the job waits in (app.queue.queue_name)."""
        return queue_name(self.hardware, self.framework, self.devices or 1)


class EpochMetric(Base):
    """One epoch of one job; (job_id, epoch) is unique so a replayed report never duplicates."""

    __tablename__ = "epoch_metrics"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    epoch: Mapped[int] = mapped_column(Integer)
    train_loss: Mapped[float] = mapped_column(Float)
    # Accuracies are null for regression; its scores (0011) are null for classification.
    train_accuracy: Mapped[float | None] = mapped_column(Float, nullable=True)
    test_loss: Mapped[float] = mapped_column(Float)
    test_accuracy: Mapped[float | None] = mapped_column(Float, nullable=True)
    epoch_time_s: Mapped[float] = mapped_column(Float)
    eval_time_s: Mapped[float] = mapped_column(Float)
    samples_per_s: Mapped[float] = mapped_column(Float)
    learning_rate: Mapped[float | None] = mapped_column(Float, nullable=True)  # null: stored before 0006
    test_rmse: Mapped[float | None] = mapped_column(Float, nullable=True)
    test_mae: Mapped[float | None] = mapped_column(Float, nullable=True)
    test_r2: Mapped[float | None] = mapped_column(Float, nullable=True)

    __table_args__ = (UniqueConstraint("job_id", "epoch", name="uq_epoch_metrics_job_epoch"),)


class Artifact(Base):
    """A file a job produced. `path` is where it lies; the name never becomes a path."""

    __tablename__ = "artifacts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200))
    size_bytes: Mapped[int] = mapped_column(BigInteger)  # weights can pass 2 GiB
    sha256: Mapped[str] = mapped_column(String(64))
    path: Mapped[str] = mapped_column(String(1000))

    __table_args__ = (UniqueConstraint("job_id", "name", name="uq_artifacts_job_name"),)


class Worker(Base):
    """A worker's last heartbeat: what it serves and what it is doing."""

    __tablename__ = "workers"

    # hostname:pid:instance; the instance (random, per process start) keeps a restarted worker
    # with the same pid (PID 1 in a container) apart from its dead predecessor.
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    hostname: Mapped[str] = mapped_column(String(200))
    hardware: Mapped[str] = mapped_column(String(16))
    queues: Mapped[list] = mapped_column(JSON)
    devices: Mapped[list] = mapped_column(JSON)
    versions: Mapped[dict] = mapped_column(JSON)
    current_job_id: Mapped[str | None] = mapped_column(String(36))
    # Whether the worker reached its broker at its last heartbeat: it can take work only then.
    broker_ok: Mapped[bool] = mapped_column(Boolean, default=True, server_default=text("true"))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The built-in datasets whose files this worker has (null: reported before 0011).
    datasets: Mapped[list | None] = mapped_column(JSON)


class RejectedSubmission(Base):
    """A submission (POST /jobs, /comparisons) refused as invalid (422): it counts towards its
    key's per-minute rate like a created job, so invalid bodies cannot buy unbounded
    validation work. Rows older than the rate window are deleted as new ones come."""

    __tablename__ = "rejected_submissions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    owner_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id", ondelete="CASCADE"))
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (Index("ix_rejected_submissions_owner_id_at", "owner_id", "at"),)


class Dataset(Base):
    """An uploaded dataset: its record; the data lies in the artifact store at `location`, in
    trainers/dataset_file.py's form, named by its sha256 (shared by every key that uploads it)."""

    __tablename__ = "datasets"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # ds_ and 32 hex digits
    owner_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    name: Mapped[str] = mapped_column(String(200))
    format: Mapped[str] = mapped_column(String(16))  # what was uploaded: npz, idx, csv, parquet, imagefolder
    task: Mapped[str] = mapped_column(String(16))
    input_shape: Mapped[list] = mapped_column(JSON)
    num_classes: Mapped[int] = mapped_column(Integer)
    class_names: Mapped[list] = mapped_column(JSON)
    train_size: Mapped[int] = mapped_column(Integer)
    test_size: Mapped[int] = mapped_column(Integer)
    bytes: Mapped[int] = mapped_column(BigInteger)  # of the stored form (what counts against the key's quota)
    upload_bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    location: Mapped[str] = mapped_column(String(1000))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        UniqueConstraint("owner_id", "sha256", name="uq_datasets_owner_sha256"),
        Index("ix_datasets_owner_id_created_at", "owner_id", "created_at"),
    )


class JobLog(Base):
    """Output of a user-code job's child (stdout and stderr), one or more whole lines a row, stored by
    the worker while the job runs (workers/user_code.py) and streamed as `log` events
    (app/events.py); the job's logs.txt artifact holds the whole of it."""

    __tablename__ = "job_logs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class CodeUpload(Base):
    """Uploaded model code (app/code/): its record; the files lie in the artifact store at
    `location` as one JSON object {name: text}, named by its sha256 (shared by every key that
    uploads the same). `entrypoints` maps "module:function" to the framework the function
    builds for, as far as its source says ("pytorch", "jax" or null: unknown)."""

    __tablename__ = "code_uploads"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)  # code_ and 32 hex digits
    owner_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    name: Mapped[str] = mapped_column(String(200))
    files: Mapped[list] = mapped_column(JSON)  # [{"name", "size_bytes"}]
    entrypoints: Mapped[dict] = mapped_column(JSON)
    bytes: Mapped[int] = mapped_column(BigInteger)
    sha256: Mapped[str] = mapped_column(String(64), index=True)
    location: Mapped[str] = mapped_column(String(1000))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (
        UniqueConstraint("owner_id", "sha256", name="uq_code_uploads_owner_sha256"),
        Index("ix_code_uploads_owner_id_created_at", "owner_id", "created_at"),
    )


class Sweep(Base):
    """A hyperparameter search: its spec (app/sweeps/spec.py), status and when it ended. Its
    trials are jobs (Job.sweep_id); its Optuna study, named by the sweep's id, lives in the same
    database (app/sweeps/study.py)."""

    __tablename__ = "sweeps"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    name: Mapped[str | None] = mapped_column(String(200))
    spec: Mapped[dict] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(16), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # Last time a process took the sweep's turn (app/sweeps/service.advance): its row lock.
    advanced_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_sweeps_owner_id_created_at", "owner_id", "created_at"),)


class Comparison(Base):
    """The same spec trained in JAX and in PyTorch. `parity` is filled by the worker that
    finishes the second job (see trainers/parity.py)."""

    __tablename__ = "comparisons"
    __table_args__ = (Index("ix_comparisons_owner_id_created_at", "owner_id", "created_at"),)  # a key's pages

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    owner_id: Mapped[str] = mapped_column(ForeignKey("api_keys.id"))
    spec: Mapped[dict] = mapped_column(JSON)
    jax_job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    pytorch_job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    parity: Mapped[dict | None] = mapped_column(JSON)

    jax_job: Mapped[Job] = relationship(foreign_keys=[jax_job_id], lazy="joined")
    pytorch_job: Mapped[Job] = relationship(foreign_keys=[pytorch_job_id], lazy="joined")


class Counter(Base):
    """A named number every process shares, kept in the database so that it survives restarts
    and every API process reports the same: the totals of app/counters.py (retention's deleted
    rows and files), and retention's schedule (when its next run is due)."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class JobCount(Base):
    """How many of a key's jobs of a queue are in a status: a gauge kept by database triggers in
    the transaction that changes a job (migration 0018), summed over `shard` (app/tallies.py)."""

    __tablename__ = "job_counts"

    owner_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    queue: Mapped[str] = mapped_column(String(40), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    shard: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")


class DurationBucket(Base):
    """One bucket of a duration histogram (kind `job` or `epoch`) of a key's jobs: how many
    values fell in it and their sum (seconds), only ever added to, by database triggers
    (migration 0018; app/tallies.py)."""

    __tablename__ = "duration_buckets"

    kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    owner_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    framework: Mapped[str] = mapped_column(String(16), primary_key=True)
    hardware: Mapped[str] = mapped_column(String(16), primary_key=True)
    status: Mapped[str] = mapped_column(String(16), primary_key=True)
    bucket: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    n: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    total: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class WebhookDelivery(Base):
    """One status change of a job, to be POSTed to its webhook: inserted by a database trigger in
    the transaction that changes the job (migration 0019), with `job` the row's columns as they
    were then; `body` is rendered at the first attempt and sent again unchanged by each retry.
    `status`: pending (due at `next_attempt_at`) | delivered | failed (gave up). `seq` numbers a
    job's changes from 1, the order they are sent in."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(36), primary_key=True, default=new_id)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    event: Mapped[str] = mapped_column(String(32))  # job.<status>
    url: Mapped[str] = mapped_column(String(2048))
    job: Mapped[dict] = mapped_column(JSON)
    body: Mapped[str | None] = mapped_column(Text)
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    response_status: Mapped[int | None] = mapped_column(Integer)  # of the last attempt
    error: Mapped[str | None] = mapped_column(String(500))  # of the last attempt

    __table_args__ = (
        UniqueConstraint("job_id", "seq", name="uq_webhook_deliveries_job_seq"),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=text("status = 'pending'"),
            sqlite_where=text("status = 'pending'"),
        ),
    )
