"""The one task: take a job id and run it. Logic lives in workers/runner.py."""

from __future__ import annotations

from celery.signals import worker_shutting_down

from app.queue import RUN_JOB_TASK
from workers import runner, warm_up
from workers.celery_app import celery
from workers.identity import current_worker


@celery.task(name=RUN_JOB_TASK)
def run_job(job_id: str) -> str:
    """Take the turn of job `job_id`'s message: run the job that is next in its queue (often that
    one); return the status it ended with, or "skipped" when none waits."""
    worker = current_worker()

    def picked(picked_id: str) -> None:
        worker.current_job_id = picked_id  # named by the heartbeat from before its claim on

    try:
        with warm_up.running_job():
            return runner.run(job_id, worker.job_info(), serves=worker.caps.queues, on_pick=picked)
    finally:
        worker.current_job_id = None


@worker_shutting_down.connect
def _stop_running_job(**_kwargs: object) -> None:
    """SIGTERM or Ctrl-C: let the running job stop at its next chunk and go back to the queue."""
    runner.shutting_down.set()
