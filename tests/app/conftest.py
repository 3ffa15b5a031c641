"""Helpers for API tests without a worker: play a worker's part by writing the rows it writes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import update


class Rows:
    """What workers/runner.py writes, done by hand: claim, report an epoch, finish."""

    def start(self, job_id: str, worker: dict | None = None) -> None:
        from app.db import session_scope
        from app.models import Job, utcnow

        with session_scope() as session:
            session.execute(update(Job).where(Job.id == job_id).values(
                status="running", started_at=utcnow(), attempts=Job.attempts + 1,
                worker=worker or {"hostname": "test", "hardware": "cpu", "devices": ["cpu:0"]}))
            session.commit()

    def epoch(self, job_id: str, epoch: int, loss: float = 1.0, epoch_time_s: float = 0.2) -> None:
        from app.db import session_scope
        from app.models import EpochMetric, Job

        with session_scope() as session:
            session.add(EpochMetric(job_id=job_id, epoch=epoch, train_loss=loss, train_accuracy=0.5 + epoch / 100,
                                    test_loss=loss * 1.1, test_accuracy=0.5 + epoch / 200,
                                    epoch_time_s=epoch_time_s, eval_time_s=0.01, samples_per_s=1000.0))
            session.execute(update(Job).where(Job.id == job_id).values(epoch=epoch))
            session.commit()

    def finish(self, job_id: str, status: str = "succeeded", seconds: float | None = None, **values) -> None:
        from app.db import session_scope
        from app.models import Job, utcnow

        with session_scope() as session:
            job = session.get(Job, job_id)
            finished_at = job.started_at + timedelta(seconds=seconds) if seconds is not None else utcnow()
            session.execute(update(Job).where(Job.id == job_id).values(status=status, finished_at=finished_at, **values))
            session.commit()


@pytest.fixture
def rows(services_env) -> Rows:
    return Rows()
