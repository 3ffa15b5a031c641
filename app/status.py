"""A job's status values: the one definition the API, workers, CLI, client and dashboard use.

Kept free of imports so that the Python client and the CLI load it without the database layer;
the transitions between these states live in app/lifecycle.py. A comparison's status takes the
same values (app/rendering.py derives it from its two jobs).
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED)
ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)
