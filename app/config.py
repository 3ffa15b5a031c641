"""Settings, read once from the environment (prefix TRAINHUB_)."""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from app import failures
from trainers import spec as hard  # JobSpec's absolute bounds: a setting may lower them, never raise them
from trainers.base import COMPILE_CACHE_MAX_BYTES

log = logging.getLogger(__name__)


class Settings(BaseSettings):
    """Every knob of the service. Defaults give the embedded stack under `var_dir`.

    - database_url: SQLAlchemy URL; default SQLite at `<var_dir>/trainhub.db`;
      PostgreSQL in production, e.g. `postgresql+psycopg://postgres@127.0.0.1:5432/test`.
    - broker_url: Celery broker; default a local filesystem transport under `<var_dir>/broker`;
      `redis://127.0.0.1:6379/0` in production.
    - artifact_dir: where workers write each job's files (`<artifact_dir>/<job id>/`); with the
      local store the API serves them from there too, so API and workers must share it.
    - artifact_store: `local` (artifact_dir, the default) or `s3`: workers upload each job's files
      to `s3://<s3_bucket>/<s3_prefix><job id>/<name>` and the API streams them back, so workers
      on other hosts need no shared filesystem (artifact_dir is then only their scratch space).
    - s3_endpoint_url, s3_region, s3_access_key_id, s3_secret_access_key: the S3-compatible store
      (MinIO, Ceph, AWS...); unset values fall back to boto3's own lookup (AWS_* variables,
      ~/.aws, instance roles).
    - data_dir: where MNIST-format data is looked for first (read by trainers/data.py).
    - compile_cache_dir: the persistent compilation cache shared by a host's workers: JAX's
      programs, and PyTorch's compiled whole steps in `torch-steps/` (default `<var_dir>/jax-cache`).
    - compile_cache_max_bytes: each framework's part of it is kept within this many bytes, the
      least recently used programs removed first (default 2 GiB).
    - api_key: the key the CLI sends as `Authorization: Bearer ...`.
    - api_url: where the CLI finds the API.

    Limits on what a request may ask for (app/limits.py enforces them; each error names the
    limit and its variable, e.g. TRAINHUB_MAX_EPOCHS). The spec fields' limits default to the
    JobSpec's hard caps (trainers/spec.py) and may only be set lower.

    - max_body_bytes: a request body larger than this is refused with 413.
    - max_json_depth: a JSON body nested deeper (objects and arrays) is refused with 422.
    - max_epochs, max_batch_size, max_parameters (weights and biases of the MLP),
      max_labels, max_label_key_chars, max_label_value_chars: a spec above one is 422.
    - max_runtime_s: the longest a job may run (seconds); a spec that asks for more is 422,
      and one that names none gets this value (so every job has a deadline).
    - max_queued_jobs_per_key: a key with this many jobs queued gets 429 for more.
    - max_submissions_per_minute: jobs a key may create in any 60 s (a comparison is two);
      past it, 429 with Retry-After.
    - max_header_bytes, max_headers: a request head (request line and header lines) of more
      bytes, or with more header lines, is refused with 431; an unfinished head holds at most
      max_header_bytes (plus one network read) before it is refused.
    - header_timeout_s: a connection that has not sent a whole request head this long after it
      opened (or after its previous response) is closed (seconds).
    - body_timeout_s: a request body not received this long after its head is answered 408 and
      the connection closed; an upload (POST /datasets) may take longer, but not this long
      between two chunks (seconds).
    - max_connections: open connections per API process; one more is answered 503 and closed.
    - cors_origins: origins (e.g. `https://ops.example.com`) whose pages may call the API from
      a browser; comma-separated or a JSON list. Empty (the default): no cross-origin requests.
    """

    model_config = SettingsConfigDict(env_prefix="TRAINHUB_", extra="ignore")

    var_dir: Path = Path("var")
    database_url: str | None = None
    broker_url: str | None = None
    artifact_dir: Path | None = None
    artifact_store: Literal["local", "s3"] = "local"
    s3_bucket: str | None = None
    s3_prefix: str = ""
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: SecretStr | None = None
    data_dir: Path | None = None
    compile_cache_dir: Path | None = None
    compile_cache_max_bytes: int = Field(COMPILE_CACHE_MAX_BYTES, ge=1024**2)
    api_key: str | None = None
    api_url: str = "http://127.0.0.1:8000"
    # PostgreSQL connections per process (SQLAlchemy's pool): kept open, and more opened for a
    # burst and closed after it. Every API process and worker has its own pool: their sum of
    # both must stay under the server's max_connections (100 by default).
    db_pool_size: int = Field(10, ge=1)
    db_max_overflow: int = Field(20, ge=0)
    # How long a request waits for a free connection before it is answered 503 (seconds).
    db_pool_timeout_s: float = Field(30.0, gt=0)
    # A worker counts as online while its last heartbeat is younger than this (seconds); a
    # running job whose worker has been silent longer is handed to another worker.
    worker_timeout_s: float = Field(30.0, gt=0)
    heartbeat_s: float = Field(5.0, gt=0)
    # Frameworks a worker imports in the background once it is online ("jax", "pytorch" or both,
    # comma-separated; workers/warm_up.py), so its first job of them does not wait for the import
    # (seconds each). Empty (the default): a worker imports only what its jobs need, when they do.
    warm_up: str = ""
    # Where clients reach the API (e.g. https://trainhub.example.com): artifact URLs in answers
    # start with it. Unset: they are relative (/jobs/...), never built from a request's Host.
    public_url: str | None = None
    # A queued job of higher priority takes the worker of a running lower-priority one when no
    # worker of its queue is free (app/scheduling.py); off: it waits for a free worker.
    preemption: bool = True
    # On SIGTERM the API stops accepting, then gives open requests (event streams, downloads)
    # this long to end before it cancels them and exits (seconds).
    shutdown_timeout_s: int = Field(3, ge=0, le=60)
    # A worker retries its writes of a job this long through a database outage or restart
    # (seconds); the job waits meanwhile, and is requeued by the reconciler if it never lands.
    db_retry_s: float = Field(90.0, ge=0)
    # Which failure types send a job back to its queue, and how often (app/failures.py):
    # "worker_lost=2,out_of_memory=1". A type it does not name is not retried, but worker_lost,
    # which defaults to 2 retries (failures.DEFAULT_RETRIES).
    retry_policy: Annotated[failures.RetryPolicy, NoDecode] = Field(default_factory=dict)
    # Deprecated (use retry_policy's worker_lost): a job whose worker was lost this many times
    # ends failed; the same as worker_lost=max_attempts-1.
    max_attempts: int | None = Field(None, ge=1)
    # Redis hands an unacknowledged message to another worker after this long; it must be
    # longer than any job may run (max_runtime_s is capped at 7 days).
    visibility_timeout_s: float = Field(8 * 24 * 3600.0, gt=0)
    # Retention (app/retention.py): finished jobs are deleted, with their metrics and artifacts,
    # this many days after they ended (a spec's retention_days may only shorten it); unset: kept
    # forever, but for jobs that set their own. The workers' reconciler looks for expired jobs at
    # most once per retention_interval_s (seconds), one worker at a time.
    retention_days: int | None = Field(None, ge=1, le=hard.MAX_RETENTION_DAYS)
    retention_interval_s: float = Field(3600.0, gt=0)
    # Webhooks (app/webhooks/): URLs that reach loopback, link-local, private, reserved or
    # multicast addresses are refused (at submission and again at each delivery) unless this is
    # set, for a deployment whose receivers live on its own network. Each API process sends the
    # due deliveries (webhook_dispatch; off: this process sends none), at most
    # webhook_concurrency at a time, each request given webhook_timeout_s; a failed one is tried
    # again after webhook_retry_base_s, doubling each time (at most an hour apart), until
    # webhook_retry_for_s after its status change, when it is marked failed. The outbox is read
    # every webhook_poll_s (seconds, all of them).
    webhook_allow_private: bool = False
    webhook_dispatch: bool = True
    webhook_concurrency: int = Field(8, ge=1, le=256)
    webhook_timeout_s: float = Field(10.0, gt=0, le=60)
    webhook_retry_base_s: float = Field(30.0, gt=0)
    webhook_retry_for_s: float = Field(24 * 3600.0, gt=0)
    webhook_poll_s: float = Field(1.0, gt=0)

    # Limits (see the docstring); defaults are the hard caps where a spec field has one.
    max_body_bytes: int = Field(256 * 1024, ge=1024)
    max_json_depth: int = Field(32, ge=4, le=256)
    max_epochs: int = Field(hard.MAX_EPOCHS, ge=1, le=hard.MAX_EPOCHS)
    max_batch_size: int = Field(hard.MAX_BATCH_SIZE, ge=1, le=hard.MAX_BATCH_SIZE)
    max_parameters: int = Field(hard.MAX_PARAMETERS, ge=1, le=hard.MAX_PARAMETERS)
    # A job's memory as estimated from its spec (trainers.spec.memory_estimate: data, params and
    # optimizer state, one batch's activations), and its examples per split.
    max_job_memory_bytes: int = Field(8 * 1024**3, ge=1)
    max_examples: int = Field(hard.MAX_EXAMPLES, ge=1, le=hard.MAX_EXAMPLES)
    max_runtime_s: float = Field(hard.MAX_RUNTIME_S, gt=0, le=hard.MAX_RUNTIME_S)
    max_labels: int = Field(hard.MAX_LABELS, ge=0, le=hard.MAX_LABELS)
    max_label_key_chars: int = Field(hard.MAX_LABEL_KEY_CHARS, ge=1, le=hard.MAX_LABEL_KEY_CHARS)
    max_label_value_chars: int = Field(hard.MAX_LABEL_VALUE_CHARS, ge=0, le=hard.MAX_LABEL_VALUE_CHARS)
    max_queued_jobs_per_key: int = Field(100, ge=1)
    max_submissions_per_minute: int = Field(60, ge=1)
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # What a connection may hold before the app sees a request (app/server.py enforces them).
    max_header_bytes: int = Field(32 * 1024, ge=1024)
    max_headers: int = Field(100, ge=8)
    header_timeout_s: float = Field(10.0, gt=0)
    body_timeout_s: float = Field(30.0, gt=0)
    max_connections: int = Field(1000, ge=1)

    # Uploaded datasets (app/datasets/): the upload's size (413 past it), what one key may store
    # (bytes of the stored form, summed over its datasets), examples, and what an archive may
    # unpack to (a zip bomb is 413): bytes, members, pixels of one image.
    max_dataset_bytes: int = Field(2 * 1024**3, ge=1024)
    max_dataset_bytes_per_key: int = Field(20 * 1024**3, ge=1024)
    max_dataset_examples: int = Field(hard.MAX_EXAMPLES, ge=2, le=hard.MAX_EXAMPLES)
    max_dataset_unpacked_bytes: int = Field(4 * 1024**3, ge=1024)
    max_dataset_files: int = Field(100_000, ge=1)
    max_image_pixels: int = Field(4096 * 4096, ge=1)
    # User model code (app/code/): off unless the deployment turns it on (and the key is allowed:
    # `trainhub keys create --allow-code`). Limits of an upload (413 past them): its bytes, its
    # files, each file's bytes, all files' unpacked bytes, a zip member's compression ratio.
    allow_user_code: bool = False
    max_code_bytes: int = Field(1024**2, ge=1024)
    max_code_files: int = Field(64, ge=1)
    max_code_file_bytes: int = Field(256 * 1024, ge=1024)
    max_code_unpacked_bytes: int = Field(4 * 1024**2, ge=1024)
    # A user-code job's child process: its address space (bytes), the largest file it may write,
    # and all it may hold in its job's folder at once (its files, checkpoints and artifacts).
    user_code_memory_bytes: int = Field(8 * 1024**3, ge=64 * 1024**2)
    user_code_file_bytes: int = Field(1024**3, ge=1024**2)
    user_code_disk_bytes: int = Field(8 * 1024**3, ge=1024**2)
    # Where the API spools uploads while it validates them (default <var_dir>/uploads).
    upload_dir: Path | None = None
    # Each worker host's cache of uploaded datasets, by sha256, least recently used evicted past
    # dataset_cache_bytes (default <var_dir>/dataset-cache, 20 GiB).
    dataset_cache_dir: Path | None = None
    dataset_cache_bytes: int = Field(20 * 1024**3, ge=0)

    @field_validator("warm_up")
    @classmethod
    def _known_frameworks(cls, value: str) -> str:
        unknown = [f for f in value.replace(" ", "").split(",") if f and f not in ("jax", "pytorch")]
        if unknown:
            raise ValueError(f"unknown framework(s) {', '.join(unknown)}: name jax, pytorch or both")
        return value.replace(" ", "")

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _origins_list(cls, value: object) -> object:
        # "https://a.example, https://b.example" or a JSON list. "*" is refused: the API takes
        # keys, so which sites may use them from a browser is a list an operator writes down.
        if isinstance(value, str):
            value = json.loads(value) if value.strip().startswith("[") else value.split(",")
        if isinstance(value, list):
            value = [str(o).strip().rstrip("/") for o in value if str(o).strip()]
            if "*" in value:
                raise ValueError("cors_origins may not be '*': list the origins that may call the API")
        return value

    @field_validator("retry_policy", mode="before")
    @classmethod
    def _parse_retry_policy(cls, value: object) -> object:
        return failures.parse_policy(value)

    @model_validator(mode="after")
    def _fold_max_attempts(self) -> Settings:
        # TRAINHUB_MAX_ATTEMPTS (deprecated) still counts for worker_lost, unless the policy says too.
        lost = failures.FailureType.WORKER_LOST
        if self.max_attempts is not None:
            if lost in self.retry_policy:
                raise ValueError(
                    "TRAINHUB_MAX_ATTEMPTS is deprecated and TRAINHUB_RETRY_POLICY names worker_lost too: "
                    "drop TRAINHUB_MAX_ATTEMPTS"
                )
            log.warning(
                "TRAINHUB_MAX_ATTEMPTS is deprecated: use TRAINHUB_RETRY_POLICY=worker_lost=%d", self.max_attempts - 1
            )
            self.retry_policy[lost] = self.max_attempts - 1
        return self

    def retries_for(self, kind: failures.FailureType) -> int:
        """How many times a job failing with `kind` goes back to its queue (retry_policy)."""
        return self.retry_policy.get(kind, failures.DEFAULT_RETRIES.get(kind, 0))

    @field_validator("retention_days", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        # docker-compose passes an unset `${TRAINHUB_RETENTION_DAYS:-}` as "": keep forever.
        return None if isinstance(value, str) and not value.strip() else value

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> Settings:
        if self.artifact_store == "s3" and not self.s3_bucket:
            raise ValueError("TRAINHUB_ARTIFACT_STORE=s3 needs TRAINHUB_S3_BUCKET")
        return self

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.var_dir / 'trainhub.db').resolve()}"

    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    def resolved_artifact_dir(self) -> Path:
        return (self.artifact_dir or self.var_dir / "artifacts").resolve()

    def resolved_upload_dir(self) -> Path:
        return (self.upload_dir or self.var_dir / "uploads").resolve()

    def resolved_dataset_cache_dir(self) -> Path:
        return (self.dataset_cache_dir or self.var_dir / "dataset-cache").resolve()

    def resolved_compile_cache_dir(self) -> Path:
        """The persistent compilation cache of this host's workers (var_dir/jax-cache by default)."""
        return (self.compile_cache_dir or self.var_dir / "jax-cache").resolve()

    def broker_transport_options(self) -> dict:
        """Folders of kombu's filesystem transport (the embedded stack's broker)."""
        if not self.resolved_broker_url().startswith("filesystem"):
            return {}
        folder = (self.var_dir / "broker").resolve()
        return {
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
        }


@lru_cache
def get_settings() -> Settings:
    return Settings()


def setting_problems(error: ValidationError) -> list[str] | None:
    """What is wrong with the TRAINHUB_* variables, a line per problem ("TRAINHUB_X='v': why"),
    when `error` is Settings' own; None for any other validation error. A problem of several
    settings together names none of their values (a database URL may hold a password)."""
    if error.title != Settings.__name__:
        return None
    lines = []
    for problem in error.errors():
        if problem["loc"]:
            name = "TRAINHUB_" + "_".join(str(part) for part in problem["loc"]).upper()
            lines.append(f"{name}={problem.get('input')!r}: {problem['msg'].removeprefix('Value error, ')}")
        else:
            lines.append(f"TRAINHUB_* settings: {problem['msg'].removeprefix('Value error, ')}")
    return lines
