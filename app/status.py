"""A job's and a sweep's status values: the one definition the API, workers, CLI, client and
dashboard use.

Kept free of imports so that the Python client and the CLI load it without the database layer;
the transitions between these states live in app/lifecycle.py (jobs) and app/sweeps/lifecycle.py
(sweeps). A comparison's status takes the job's values (app/rendering.py derives it from its two
jobs).
"""

from __future__ import annotations

from enum import StrEnum


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    # A sweep's trial stopped early by the sweep's pruner: not a failure, not the user's cancel.
    PRUNED = "pruned"


FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED, JobStatus.PRUNED)
ACTIVE = (JobStatus.QUEUED, JobStatus.RUNNING)


class SweepStatus(StrEnum):
    """running: trials are queued or run, or more will be; succeeded: every trial ended and at
    least one completed; failed: every trial ended and none completed; cancelled: by the user."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
