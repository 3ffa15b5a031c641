"""The broker side of the API: enqueue a job's id by task name, never importing workers/."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from celery import Celery

from app.config import Settings, get_settings

RUN_JOB_TASK = "trainhub.run_job"


def make_celery(settings: Settings) -> Celery:
    """A Celery app configured for trainhub's broker; the worker builds on the same config."""
    celery = Celery("trainhub", broker=settings.resolved_broker_url())
    transport_options = settings.broker_transport_options()
    for key in ("data_folder_in", "processed_folder", "control_folder"):
        if key in transport_options:
            Path(transport_options[key]).mkdir(parents=True, exist_ok=True)
    if settings.resolved_broker_url().startswith("redis"):
        transport_options["visibility_timeout"] = settings.visibility_timeout_s
        # How often a worker looks for messages whose visibility timed out (kombu's default is
        # every 10 x 10 s); a redelivered job id is harmless, its claim does nothing.
        transport_options["unacked_restore_interval"] = min(10.0, max(1.0, settings.visibility_timeout_s / 2))
        transport_options["unacked_restore_throttle"] = 1
    celery.conf.update(
        broker_transport_options=transport_options,
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_create_missing_queues=True,
        task_ignore_result=True,
        worker_hijack_root_logger=False,
        # A submit while the broker is down must answer quickly: the job row is already stored
        # and the reconciler sends its id once the broker is back.
        task_publish_retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.2},
        broker_connection_timeout=2,
    )
    return celery


@lru_cache
def get_celery() -> Celery:
    return make_celery(get_settings())


def queue_name(hardware: str, framework: str, devices: int = 1) -> str:
    """`cpu.jax` for a job on one device; `cpu.jax.x4` for one data parallel over 4 devices.

    A worker that owns D devices of its hardware consumes the queues of 1..D devices, so a job
    never reaches a worker with fewer devices than it asks for: it waits in its queue."""
    return f"{hardware}.{framework}" if devices == 1 else f"{hardware}.{framework}.x{devices}"


def queues_served(hardware: str, framework: str, devices: int) -> list[str]:
    """The queues of a worker owning `devices` devices of `hardware` for `framework`."""
    return [queue_name(hardware, framework, n) for n in range(1, devices + 1)]


def enqueue(job_id: str, queue: str) -> None:
    """Send the job's id to `queue` (`Job.queue`). Raises on a broker error."""
    get_celery().send_task(RUN_JOB_TASK, args=[job_id], queue=queue)
