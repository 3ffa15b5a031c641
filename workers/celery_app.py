"""The worker's Celery app: the API's broker configuration plus the task."""

from __future__ import annotations

from app.config import get_settings
from app.queue import make_celery

celery = make_celery(get_settings())
celery.conf.update(
    # One job at a time per device, and no message held back for later while one trains.
    worker_concurrency=1,
    worker_prefetch_multiplier=1,
    worker_cancel_long_running_tasks_on_connection_loss=False,
)
celery.conf.imports = ("workers.tasks",)
