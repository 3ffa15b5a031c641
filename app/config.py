"""Settings, read once from the environment (prefix TRAINHUB_)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob of the service. Defaults give the embedded stack under `var_dir`.

    - database_url: SQLAlchemy URL; default SQLite at `<var_dir>/trainhub.db`;
      PostgreSQL in production, e.g. `postgresql+psycopg://postgres@127.0.0.1:5432/test`.
    - broker_url: Celery broker; default a local filesystem transport under `<var_dir>/broker`;
      `redis://127.0.0.1:6379/0` in production.
    - artifact_dir: where workers write each job's files (`<artifact_dir>/<job id>/`).
    - data_dir: where MNIST-format data is looked for first (read by trainers/data.py).
    - compile_cache_dir: JAX's persistent compilation cache, shared by a host's workers
      (default `<var_dir>/jax-cache`).
    - api_key: the key the CLI sends as `Authorization: Bearer ...`.
    - api_url: where the CLI finds the API.
    """

    model_config = SettingsConfigDict(env_prefix="TRAINHUB_", extra="ignore")

    var_dir: Path = Path("var")
    database_url: str | None = None
    broker_url: str | None = None
    artifact_dir: Path | None = None
    data_dir: Path | None = None
    compile_cache_dir: Path | None = None
    api_key: str | None = None
    api_url: str = "http://127.0.0.1:8000"
    # A worker counts as online while its last heartbeat is younger than this (seconds); a
    # running job whose worker has been silent longer is handed to another worker.
    worker_timeout_s: float = Field(30.0, gt=0)
    heartbeat_s: float = Field(5.0, gt=0)
    # A job whose worker was lost this many times ends failed with error.type "worker_lost".
    max_attempts: int = Field(3, ge=1)
    # Redis hands an unacknowledged message to another worker after this long; it must be
    # longer than any job may run (max_runtime_s is capped at 7 days).
    visibility_timeout_s: float = Field(8 * 24 * 3600.0, gt=0)

    def resolved_database_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.var_dir / 'trainhub.db').resolve()}"

    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

    def resolved_artifact_dir(self) -> Path:
        return (self.artifact_dir or self.var_dir / "artifacts").resolve()

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
