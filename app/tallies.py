"""The running totals /metrics reads: jobs by key, queue and status, and the job and epoch
duration histograms, kept in `job_counts` and `duration_buckets` by database triggers on `jobs`
and `epoch_metrics` (migration 0018), in the transaction that changes the rows.

A scrape reads these few rows (per key, queue, status and label set; never per job), so its cost
does not grow with the jobs stored. `fill` counts them again from the rows (the migration runs
it once; `trainhub rebuild-metrics` when ever needed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, Connection, FromClause, String, case, cast, delete, func, insert, literal, select
from sqlalchemy.orm import Session
from sqlalchemy.sql import Select

from app.models import DurationBucket, EpochMetric, Job, JobCount
from app.status import FINISHED, JobStatus

# The histograms' upper bounds (seconds); the triggers hold the same (migration 0018).
JOB_BOUNDS = (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 7 * 24 * 3600)
EPOCH_BOUNDS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)


def _own(query: Select, owner_id: str | None, column: Any) -> Select:
    return query if owner_id is None else query.where(column == owner_id)


def jobs_by_status(session: Session, owner_id: str | None = None) -> dict[str, int]:
    """Jobs in each status (of the key `owner_id`, or of every key)."""
    query = _own(select(JobCount.status, func.sum(JobCount.n)), owner_id, JobCount.owner_id)
    return {status: int(n) for status, n in session.execute(query.group_by(JobCount.status))}


def queue_depths(session: Session, owner_id: str | None = None) -> dict[str, int]:
    """Queued jobs per queue (of the key `owner_id`, or of every key)."""
    query = _own(
        select(JobCount.queue, func.sum(JobCount.n)).where(JobCount.status == JobStatus.QUEUED.value),
        owner_id,
        JobCount.owner_id,
    )
    return {queue: int(n) for queue, n in session.execute(query.group_by(JobCount.queue))}


def histogram_rows(session: Session, kind: str, labels: Sequence[str], owner_id: str | None = None) -> list[tuple]:
    """One row per label set of the `kind` histogram: (*labels, count, sum, cumulative count of
    each bound), the shape app/metrics.histogram takes."""
    bounds = JOB_BOUNDS if kind == "job" else EPOCH_BOUNDS
    columns = [getattr(DurationBucket, name) for name in labels]
    query = _own(
        select(*columns, DurationBucket.bucket, func.sum(DurationBucket.n), func.sum(DurationBucket.total)).where(
            DurationBucket.kind == kind
        ),
        owner_id,
        DurationBucket.owner_id,
    ).group_by(*columns, DurationBucket.bucket)
    sets: dict[tuple, list[float]] = {}
    for row in session.execute(query):
        *label_values, bucket, n, total = tuple(row)
        per_bucket = sets.setdefault(tuple(label_values), [0.0] * (len(bounds) + 2))  # buckets, +Inf, sum
        per_bucket[bucket] += int(n)
        per_bucket[-1] += float(total)
    rows = []
    for labelled, counts in sorted(sets.items()):
        cumulative, running = [], 0.0
        for count in counts[: len(bounds)]:
            running += count
            cumulative.append(running)
        rows.append((*labelled, running + counts[len(bounds)], counts[-1], *cumulative))
    return rows


def fill(connection: Connection) -> None:
    """Count the tallies again from the jobs and epochs stored (in the connection's transaction):
    what the triggers would hold had they always run. On PostgreSQL the tables counted from are
    locked against writes until the transaction ends, so no change slips between the two."""
    postgres = connection.dialect.name == "postgresql"
    if postgres:
        connection.exec_driver_sql("LOCK TABLE jobs, epoch_metrics IN SHARE MODE")
    connection.execute(delete(JobCount))
    connection.execute(delete(DurationBucket))
    queue = Job.hardware + "." + Job.framework + case((Job.devices > 1, ".x" + cast(Job.devices, String)), else_="")
    counted = select(Job.owner_id, queue, Job.status, literal(0), func.count()).group_by(
        Job.owner_id, queue, Job.status
    )
    connection.execute(insert(JobCount).from_select(["owner_id", "queue", "status", "shard", "n"], counted))

    job_s: Any
    if postgres:
        job_s = func.extract("epoch", Job.finished_at - Job.started_at)
    else:
        job_s = (func.julianday(Job.finished_at) - func.julianday(Job.started_at)) * 86400.0
    finished = (Job.status.in_(FINISHED), Job.started_at.is_not(None), Job.finished_at.is_not(None))
    _fill_histogram(connection, "job", job_s, JOB_BOUNDS, per_status=True, source=Job.__table__, where=finished)
    epochs = EpochMetric.__table__.join(Job.__table__, Job.id == EpochMetric.job_id)
    _fill_histogram(connection, "epoch", EpochMetric.epoch_time_s, EPOCH_BOUNDS, per_status=False, source=epochs)


def _fill_histogram(
    connection: Connection,
    kind: str,
    seconds: Any,
    bounds: tuple,
    per_status: bool,
    source: FromClause,
    where: Sequence[ColumnElement[bool]] = (),
) -> None:
    bucket = case(*((seconds <= bound, index) for index, bound in enumerate(bounds)), else_=len(bounds))
    labels = [Job.owner_id, Job.framework, Job.hardware, *([Job.status] if per_status else [])]
    query = (
        select(
            literal(kind),
            *labels[:3],
            Job.status if per_status else literal(""),
            bucket,
            func.count(),
            func.sum(seconds),
        )
        .select_from(source)
        .where(*where)
        .group_by(*labels, bucket)
    )
    columns = ["kind", "owner_id", "framework", "hardware", "status", "bucket", "n", "total"]
    connection.execute(insert(DurationBucket).from_select(columns, query))


def rebuild(session: Session) -> None:
    """`fill`, in the session's transaction, committed."""
    fill(session.connection())
    session.commit()
