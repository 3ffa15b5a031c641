"""Retention: finished jobs past their retention are deleted with their metrics, artifacts and files.

When a job expires: `retention_days` days after it finished, the shorter of its own
(spec.retention_days) and the server's (TRAINHUB_RETENTION_DAYS); a job with neither is kept
forever. Only finished jobs (succeeded, failed, cancelled, pruned) expire: a queued or running
job is never deleted, however old.

What goes together: a comparison with its two jobs, and a sweep with all its trials (their
comparisons too) and its Optuna study. Such a connected group goes only when every job in it
has expired and none of its sweeps still runs; otherwise none of it goes (`kept` counts the
expired jobs held back so).

How (`delete_expired`): the expired jobs are read oldest first, BATCH_JOBS at a time (with the
rest of their groups), and each batch is one transaction: the batch's rows are locked, and a
group with a row that changed since it was read (a job no longer finished) is left; then the
files go (the job's folder in the artifact dir, and its S3 objects; a file already gone is
fine), then the rows (comparisons, jobs with their epoch_metrics and artifacts by ON DELETE
CASCADE, sweeps), and the counters of app/counters.py grow by what went, in the same
transaction. The deleted sweeps' studies go after the commit. A file that cannot be deleted (the
store is away) ends the run before its batch's rows are deleted: the next run tries again. A
dry run reads the same and deletes nothing.

The workers' reconciler runs it (`delete_expired_if_due`) at most once per
`retention_interval_s` across the fleet: a compare-and-set on the `retention_due_at_s` counter
picks one worker, which works for at most TICK_BUDGET_S per heartbeat (its next beat must not
wait long) and, when more remains, leaves the run due, so that the next tick goes on with it.
`trainhub gc` (app/cli_gc.py) runs it by hand, to the end.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, delete, or_, select, tuple_, update
from sqlalchemy.orm import Session

from app import counters
from app.config import Settings, get_settings
from app.db import session_scope
from app.models import Artifact, Comparison, Counter, Job, Sweep, aware, utcnow
from app.status import FINISHED, SweepStatus
from app.storage import S3Store, is_s3, split_s3, store_for
from trainers.spec import TrainingSpec

log = logging.getLogger(__name__)

# Expired jobs per transaction (their groups' other jobs come along): a year of jobs is many
# short transactions, not one that holds its locks for minutes.
BATCH_JOBS = 500
# Ids per IN (...) list: far below PostgreSQL's 65535 and SQLite's 32766 bound parameters.
IN_CHUNK = 1000
# What one heartbeat's run may take (seconds; less when the worker timeout is short): the
# heartbeat thread beats again only after it, and a silent worker looks lost.
TICK_BUDGET_S = 10.0
# How long a worker holds the run it claimed before another may take it over (seconds): one
# that died mid-run is replaced after this.
LEASE_S = 120
# How often a worker that did not get the run looks again (seconds): the due time is one row.
LOOK_EVERY_S = 60.0

# The counters (app/counters.py) that /metrics reports, and the one that schedules the runs
# (epoch seconds when the next run is due).
DELETED_JOBS = "retention_deleted_jobs"
DELETED_COMPARISONS = "retention_deleted_comparisons"
DELETED_SWEEPS = "retention_deleted_sweeps"
DELETED_FILES = "retention_deleted_files"
DELETED_BYTES = "retention_deleted_bytes"
COUNTERS = (DELETED_JOBS, DELETED_COMPARISONS, DELETED_SWEEPS, DELETED_FILES, DELETED_BYTES)
DUE_AT = "retention_due_at_s"


@dataclass
class Report:
    """What a run deleted (or, dry, would delete): ids, files and their bytes, and the expired
    jobs kept because their group still holds a job that has not expired or a running sweep.
    `done` is False when the run stopped at its time budget with more to look at."""

    retention_days: int | None  # the server's (TRAINHUB_RETENTION_DAYS)
    dry_run: bool
    jobs: list[str] = field(default_factory=list)
    comparisons: list[str] = field(default_factory=list)
    sweeps: list[str] = field(default_factory=list)
    files: int = 0
    bytes: int = 0
    kept: int = 0
    done: bool = True

    def counts(self) -> dict[str, int]:
        """Counter name -> how much this run adds to it."""
        return {
            DELETED_JOBS: len(self.jobs),
            DELETED_COMPARISONS: len(self.comparisons),
            DELETED_SWEEPS: len(self.sweeps),
            DELETED_FILES: self.files,
            DELETED_BYTES: self.bytes,
        }

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class JobRow:
    id: str
    status: str
    finished_at: datetime | None
    retention_days: int | None
    sweep_id: str | None


@dataclass
class Group:
    """Jobs that go together, with the comparisons and sweeps that join them."""

    jobs: dict[str, JobRow] = field(default_factory=dict)
    comparisons: set[str] = field(default_factory=set)
    sweeps: dict[str, str] = field(default_factory=dict)  # id -> status


@dataclass(frozen=True)
class StoredFile:
    location: str  # a local path or s3://bucket/key
    size: int  # bytes


# --- when a job expires ----------------------------------------------------------------------


def expires_at(finished_at: datetime | None, own_days: int | None, server_days: int | None) -> datetime | None:
    """When a job that finished at `finished_at` expires: after the shorter of its own retention
    and the server's (days). None: never (neither is set, or it has not finished)."""
    days = [d for d in (own_days, server_days) if d is not None]
    if finished_at is None or not days:
        return None
    return aware(finished_at) + timedelta(days=min(days))


def is_expired(row: JobRow, now: datetime, server_days: int | None) -> bool:
    """Whether the job is finished and past its retention at `now`."""
    expiry = expires_at(row.finished_at, row.retention_days, server_days)
    return row.status in FINISHED and expiry is not None and expiry <= now


def deletable(group: Group, now: datetime, server_days: int | None) -> bool:
    """Whether the whole group may go: every job expired, no sweep running."""
    jobs_expired = all(is_expired(row, now, server_days) for row in group.jobs.values())
    return jobs_expired and all(status != SweepStatus.RUNNING for status in group.sweeps.values())


def spec_errors(spec: TrainingSpec, settings: Settings | None = None) -> list[dict]:
    """The 422 `detail` items (app/limits.py's shape) for a spec whose retention_days is longer
    than the server keeps jobs (TRAINHUB_RETENTION_DAYS); [] when it fits or either is unset."""
    server = (settings or get_settings()).retention_days
    if spec.retention_days is None or server is None or spec.retention_days <= server:
        return []
    return [
        {
            "type": "limit_exceeded",
            "loc": ["body", "retention_days"],
            "msg": f"retention_days {spec.retention_days} is longer than this server keeps finished jobs "
            f"(limit retention_days = {server:,}, set by TRAINHUB_RETENTION_DAYS)",
            "ctx": {"limit": "retention_days", "value": server},
        }
    ]


# --- a run -----------------------------------------------------------------------------------


def delete_expired(dry_run: bool = False, budget_s: float | None = None, settings: Settings | None = None) -> Report:
    """Delete every expired job with its group (the module docstring says what and how), or with
    `dry_run` only say what would go. Stops after the batch that passes `budget_s` seconds
    (None: runs to the end), with `done` False when more was left. Raises StoreUnavailable
    (or OSError) when a file cannot be deleted: that batch's rows stay, earlier batches are gone."""
    settings = settings or get_settings()
    now = utcnow()
    report = Report(settings.retention_days, dry_run)
    seen: set[str] = set()  # jobs judged with their group already: each is counted once
    started = time.monotonic()
    with session_scope() as session:
        for number, page in enumerate(_expired_pages(session, now, settings.retention_days)):
            if number and budget_s is not None and time.monotonic() - started > budget_s:
                report.done = False  # (known only once there is another page)
                break
            groups = _groups(session, [job_id for job_id in page if job_id not in seen])
            going = [group for group in groups if deletable(group, now, settings.retention_days)]
            kept = [group for group in groups if not deletable(group, now, settings.retention_days)]
            report.kept += sum(is_expired(row, now, settings.retention_days) for g in kept for row in g.jobs.values())
            # Deleted jobs cannot come back in a later page; kept ones (and a dry run's) can.
            seen.update(job_id for group in (groups if dry_run else kept) for job_id in group.jobs)
            if dry_run:
                _account(report, going, _stored_files(session, going, settings))
                session.commit()  # ends the read: the next page sees a fresh snapshot
            else:
                _delete(session, going, report, settings)
    return report


def _expired_pages(session: Session, now: datetime, server_days: int | None) -> Iterator[list[str]]:
    """The ids of the expired jobs, a page of at most BATCH_JOBS at a time, oldest first: those
    past the server's retention (a range of ix_jobs_finished_at), then those past a shorter one
    of their own (ix_jobs_own_retention; a retention is at least a day). A page may hold jobs
    already seen, and be empty."""
    finished = Job.status.in_(FINISHED)
    if server_days is not None:
        for page in _pages(session, [finished, Job.finished_at < now - timedelta(days=server_days)]):
            yield [row.id for row in page]
    for page in _pages(session, [finished, Job.retention_days.is_not(None), Job.finished_at < now - timedelta(days=1)]):
        yield [row.id for row in page if is_expired(row, now, server_days)]


def _pages(session: Session, where: Sequence[ColumnElement[bool]]) -> Iterator[list[JobRow]]:
    """The jobs matching `where` by (finished_at, id), BATCH_JOBS at a time. Each page is a new
    query after the last one seen, so rows deleted between pages shift nothing."""
    after: tuple[datetime, str] | None = None
    while True:
        query = select(*_JOB_COLUMNS).where(*where).order_by(Job.finished_at, Job.id).limit(BATCH_JOBS)
        if after is not None:
            query = query.where(tuple_(Job.finished_at, Job.id) > after)
        rows = [JobRow(*row) for row in session.execute(query)]
        if not rows:
            return
        yield rows
        last = rows[-1]
        after = (cast(datetime, last.finished_at), last.id)


_JOB_COLUMNS = (Job.id, Job.status, Job.finished_at, Job.retention_days, Job.sweep_id)


def _chunks(ids: Iterable[str]) -> Iterator[list[str]]:
    ordered = sorted(ids)  # sorted: locks are taken in one order by every run
    for start in range(0, len(ordered), IN_CHUNK):
        yield ordered[start : start + IN_CHUNK]


# --- groups ----------------------------------------------------------------------------------


def _groups(session: Session, job_ids: Sequence[str]) -> list[Group]:
    """The groups of `job_ids`: each job with every job, comparison and sweep it is joined to,
    through comparisons (their two jobs) and sweeps (all their trials), followed to the end."""
    jobs: dict[str, JobRow] = {}
    comparisons: dict[str, tuple[str, str]] = {}
    sweeps: dict[str, str] = {}
    asked: set[str] = set()
    frontier = set(job_ids)
    while frontier:
        asked |= frontier
        found = _job_rows(session, frontier)
        jobs.update(found)
        new_sweeps = {row.sweep_id for row in found.values() if row.sweep_id} - sweeps.keys()
        sweeps.update(_sweep_statuses(session, new_sweeps))
        pairs = _comparisons_of(session, frontier)
        comparisons.update(pairs)
        joined = {job_id for pair in pairs.values() for job_id in pair} | _trial_ids(session, new_sweeps)
        frontier = joined - asked
    return _connect(jobs, comparisons, sweeps)


def _job_rows(session: Session, ids: Iterable[str]) -> dict[str, JobRow]:
    return {
        row.id: row
        for chunk in _chunks(ids)
        for row in (JobRow(*r) for r in session.execute(select(*_JOB_COLUMNS).where(Job.id.in_(chunk))))
    }


def _sweep_statuses(session: Session, ids: Iterable[str]) -> dict[str, str]:
    return {
        sweep_id: status
        for chunk in _chunks(ids)
        for sweep_id, status in session.execute(select(Sweep.id, Sweep.status).where(Sweep.id.in_(chunk)))
    }


def _trial_ids(session: Session, sweep_ids: Iterable[str]) -> set[str]:
    return {
        job_id
        for chunk in _chunks(sweep_ids)
        for job_id in session.scalars(select(Job.id).where(Job.sweep_id.in_(chunk)))
    }


def _comparisons_of(session: Session, job_ids: Iterable[str]) -> dict[str, tuple[str, str]]:
    """The comparisons of any of `job_ids`: id -> (jax job, pytorch job)."""
    c = Comparison.__table__.c  # the table, not the entity: no joined load of both jobs
    return {
        comparison_id: (jax_id, pytorch_id)
        for chunk in _chunks(job_ids)
        for comparison_id, jax_id, pytorch_id in session.execute(
            select(c.id, c.jax_job_id, c.pytorch_job_id).where(
                or_(c.jax_job_id.in_(chunk), c.pytorch_job_id.in_(chunk))
            )
        )
    }


def _connect(jobs: dict[str, JobRow], comparisons: dict[str, tuple[str, str]], sweeps: dict[str, str]) -> list[Group]:
    """Split what was found into its connected groups (union-find over jobs and sweeps)."""
    parent: dict[str, str] = {}

    def root(node: str) -> str:
        while parent.setdefault(node, node) != node:
            parent[node] = parent[parent[node]]  # path halving
            node = parent[node]
        return node

    def join(a: str, b: str) -> None:
        parent[root(a)] = root(b)

    for jax_id, pytorch_id in comparisons.values():
        join(jax_id, pytorch_id)
    for row in jobs.values():
        if row.sweep_id:
            join(row.id, f"sweep:{row.sweep_id}")
    groups: dict[str, Group] = {}
    for row in jobs.values():
        groups.setdefault(root(row.id), Group()).jobs[row.id] = row
    for comparison_id, (jax_id, _) in comparisons.items():
        groups.setdefault(root(jax_id), Group()).comparisons.add(comparison_id)
    for sweep_id, status in sweeps.items():
        groups.setdefault(root(f"sweep:{sweep_id}"), Group()).sweeps[sweep_id] = status
    return list(groups.values())


# --- deleting --------------------------------------------------------------------------------


def _delete(session: Session, groups: list[Group], report: Report, settings: Settings) -> None:
    """In one transaction, which this commits: lock the groups' rows, delete their files, then
    their rows, and add them to the counters and to `report`; then the deleted sweeps' studies."""
    groups = _lock(session, groups)
    files = _stored_files(session, groups, settings)
    _delete_files(files, _job_folders(groups, settings), settings)
    batch = Report(report.retention_days, dry_run=False)
    _account(batch, groups, files)
    for chunk in _chunks(batch.comparisons):
        session.execute(delete(Comparison).where(Comparison.id.in_(chunk)), execution_options=_NO_SYNC)
    for chunk in _chunks(batch.jobs):  # epoch_metrics and artifacts go by ON DELETE CASCADE
        session.execute(delete(Job).where(Job.id.in_(chunk)), execution_options=_NO_SYNC)
    for chunk in _chunks(batch.sweeps):
        session.execute(delete(Sweep).where(Sweep.id.in_(chunk)), execution_options=_NO_SYNC)
    counters.add(session, batch.counts())
    session.commit()
    _delete_studies(batch.sweeps)
    _account(report, groups, files)
    if batch.jobs:
        log.info(
            "retention: deleted %d jobs (%s), %d comparisons, %d sweeps, %d files (%d bytes)",
            len(batch.jobs),
            _short(batch.jobs),
            len(batch.comparisons),
            len(batch.sweeps),
            batch.files,
            batch.bytes,
        )


_NO_SYNC = {"synchronize_session": False}  # no row of these is loaded in the session


def _lock(session: Session, groups: list[Group]) -> list[Group]:
    """Lock the groups' job and sweep rows for the transaction (SELECT ... FOR UPDATE, in id
    order); the groups whose rows all are still there and still finished (jobs) or not running
    (sweeps). SQLite has no row locks: its one writer at a time serialises the runs instead."""
    job_ids = [job_id for group in groups for job_id in group.jobs]
    sweep_ids = [sweep_id for group in groups for sweep_id in group.sweeps]
    locked = {
        job_id
        for chunk in _chunks(job_ids)
        for job_id in session.scalars(
            select(Job.id).where(Job.id.in_(chunk), Job.status.in_(FINISHED)).order_by(Job.id).with_for_update()
        )
    }
    locked |= {
        sweep_id
        for chunk in _chunks(sweep_ids)
        for sweep_id in session.scalars(
            select(Sweep.id)
            .where(Sweep.id.in_(chunk), Sweep.status != SweepStatus.RUNNING)
            .order_by(Sweep.id)
            .with_for_update()
        )
    }
    return [group for group in groups if locked.issuperset(group.jobs) and locked.issuperset(group.sweeps)]


def _account(report: Report, groups: list[Group], files: list[StoredFile]) -> None:
    for group in groups:
        report.jobs.extend(sorted(group.jobs))
        report.comparisons.extend(sorted(group.comparisons))
        report.sweeps.extend(sorted(group.sweeps))
    report.files += len(files)
    report.bytes += sum(f.size for f in files)


def _short(ids: Sequence[str], shown: int = 10) -> str:
    return " ".join(i[:8] for i in ids[:shown]) + (f" and {len(ids) - shown} more" if len(ids) > shown else "")


def _stored_files(session: Session, groups: list[Group], settings: Settings) -> list[StoredFile]:
    """The files of the groups' jobs: everything in each job's folder of the artifact dir
    (artifacts, checkpoints, scratch), and each artifact recorded elsewhere (S3 objects, with
    the size their row records; a local file outside the folder, if it is there)."""
    root = settings.resolved_artifact_dir()
    job_ids = [job_id for group in groups for job_id in group.jobs]
    files = {f.location: f for folder in _job_folders(groups, settings) for f in _folder_files(folder)}
    for chunk in _chunks(job_ids):
        for location, size in session.execute(
            select(Artifact.path, Artifact.size_bytes).where(Artifact.job_id.in_(chunk))
        ):
            if location in files:
                continue
            if is_s3(location):
                files[location] = StoredFile(location, size)
            elif (path := Path(location)).is_file() and path.resolve().is_relative_to(root):
                files[location] = StoredFile(location, path.stat().st_size)
    return sorted(files.values(), key=lambda f: f.location)


def _job_folders(groups: list[Group], settings: Settings) -> list[Path]:
    """The groups' jobs' folders `<artifact dir>/<job id>` that exist (a folder right under the
    artifact dir, named by the id: an id never leads elsewhere)."""
    root = settings.resolved_artifact_dir()
    folders = ((job_id, root / job_id) for group in groups for job_id in group.jobs)
    return [f for job_id, f in folders if f.parent == root and f.name == job_id != ".." and f.is_dir()]


def _folder_files(folder: Path) -> list[StoredFile]:
    """Every file under `folder` (links are not followed: a link is a file of its own)."""
    found = []
    for directory, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(directory, name)
            try:
                found.append(StoredFile(path, os.lstat(path).st_size))
            except FileNotFoundError:  # deleted meanwhile
                continue
    return found


def _delete_files(files: list[StoredFile], folders: list[Path], settings: Settings) -> None:
    """Delete the files (S3 objects by bucket, in batches), then the jobs' `folders` with what
    is left in them (empty folders). A file already gone is fine. Raises StoreUnavailable or
    OSError when one cannot be deleted."""
    by_bucket: dict[str, list[str]] = {}
    for f in files:
        if is_s3(f.location):
            by_bucket.setdefault(split_s3(f.location)[0], []).append(f.location)
        else:
            Path(f.location).unlink(missing_ok=True)
    for locations in by_bucket.values():
        store = store_for(locations[0], settings)
        assert isinstance(store, S3Store)  # an s3:// location's store
        store.delete_many(locations)
    for folder in folders:
        shutil.rmtree(folder, onerror=_gone_is_fine)


def _gone_is_fine(_function: Any, _path: str, exc_info: Any) -> None:
    if not isinstance(exc_info[1], FileNotFoundError):
        raise exc_info[1]


def _delete_studies(sweep_ids: Sequence[str]) -> None:
    """Delete the sweeps' Optuna studies (their rows are gone). A study that is not there is
    fine; one that cannot be deleted now is left behind (it takes a little space, and no sweep
    reads it any more) with a warning."""
    if not sweep_ids:
        return
    import optuna

    from app.sweeps import study

    for sweep_id in sweep_ids:
        try:
            optuna.delete_study(study_name=sweep_id, storage=study.get_storage())
        except KeyError:
            continue  # never made, or deleted already
        except Exception as exc:  # the study's storage is away: its rows are gone all the same
            log.warning("retention: sweep %s's Optuna study was not deleted: %s: %s", sweep_id, type(exc).__name__, exc)


# --- the periodic run ------------------------------------------------------------------------

_next_look = 0.0  # time.monotonic() before which this process does not look at the due time


def delete_expired_if_due(settings: Settings | None = None) -> Report | None:
    """Run `delete_expired` for at most TICK_BUDGET_S when it is due and no other worker has it
    (the module docstring says how); None when it was not this process's turn. Called by the
    reconciler at every heartbeat; the due time is read at most every LOOK_EVERY_S while this
    process does not hold the run."""
    global _next_look
    settings = settings or get_settings()
    if time.monotonic() < _next_look:
        return None
    _next_look = time.monotonic() + LOOK_EVERY_S
    now_s = int(time.time())
    if not _claim(now_s, now_s + LEASE_S):
        return None
    budget_s = min(TICK_BUDGET_S, settings.worker_timeout_s / 3)
    try:
        report = delete_expired(budget_s=budget_s, settings=settings)
    except Exception:
        _schedule(int(time.time()) + LEASE_S)  # try again after a lease, by whichever worker
        raise
    if report.done:
        _schedule(int(time.time() + settings.retention_interval_s))
    else:
        _schedule(int(time.time()))  # more to do: due at once, at the next heartbeat
        _next_look = 0.0
    log.log(
        logging.INFO if report.jobs or report.kept else logging.DEBUG,
        "retention: %d jobs, %d comparisons, %d sweeps and %d files (%d bytes) deleted; %d expired jobs kept%s",
        len(report.jobs),
        len(report.comparisons),
        len(report.sweeps),
        report.files,
        report.bytes,
        report.kept,
        "" if report.done else "; more at the next heartbeat",
    )
    return report


def _claim(now_s: int, until_s: int) -> bool:
    """Take the run when it is due (compare-and-set on the counter): whether this process got it."""
    with session_scope() as session:
        result = cast(
            CursorResult,
            session.execute(
                update(Counter).where(Counter.name == DUE_AT, Counter.value <= now_s).values(value=until_s)
            ),
        )
        session.commit()
    return result.rowcount == 1


def _schedule(due_s: int) -> None:
    """Make the next run due at `due_s` (epoch seconds), which also ends this process's lease."""
    with session_scope() as session:
        session.execute(update(Counter).where(Counter.name == DUE_AT).values(value=due_s))
        session.commit()
