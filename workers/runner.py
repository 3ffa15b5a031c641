"""Run one job: claim its row, train, record each epoch, store artifacts, end it.

A message is a turn in its job's queue: the job claimed is the one that runs next in that queue
by the fair share across keys (app/scheduling.py), often but not always the message's own. The
database row is the truth: a claim is a compare-and-set from `queued` to `running`, so a
message delivered twice (or for a cancelled job) claims at most a job still waiting. Every later write is fenced by
the attempt number the claim took: if the reconciler handed the job to another worker (this
one was thought lost), this run's writes no longer apply and it stops at its next chunk.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import StatementError
from sqlalchemy.orm import Session

import trainers
from app import failures, jobs, lifecycle, queue, scheduling, storage
from app.config import get_settings
from app.db import get_engine, is_transient, retrying, session_scope
from app.lifecycle import JobStatus
from app.models import Artifact, EpochMetric, Job, utcnow
from trainers.spec import PRIORITIES, JobSpec
from workers import dataset_cache, user_code

if TYPE_CHECKING:  # imported where first used: a fresh worker's first job waits for neither
    from app.sweeps import service as sweeps  # (fastapi, through the sweep spec's validation)

log = logging.getLogger(__name__)

# Set when the worker is asked to stop (SIGTERM, Ctrl-C): the job stops at its next chunk of
# steps and goes back to the queue, instead of holding the shutdown or being killed mid-epoch.
shutting_down = threading.Event()

# A running job looks at its cancel flag at most this often (seconds), between chunks of steps.
CANCEL_POLL_S = 0.5
# And whether a job of higher priority waits for its worker (app/scheduling.preempting).
PREEMPT_POLL_S = 1.0


def run(
    job_id: str, worker: dict, serves: list[str] | None = None, on_pick: Callable[[str], None] | None = None
) -> str:
    """Take the turn of job `job_id`'s message: claim the job that runs next in its queue and run
    it; return the status it ended with, "skipped" when no job waits there, or "misrouted" when
    the queue is not among `serves` (the queues this worker checked it can serve). `on_pick` is
    told the id of the job about to be claimed, before the claim (the heartbeat names it).

    Whatever happens after the claim, the job ends succeeded, failed or cancelled, or (when the
    worker is shutting down) goes back to queued to resume elsewhere. Its writes are retried
    through a database outage of up to Settings.db_retry_s; if the database stays away longer,
    the job is handed back to the queue, and if even that cannot be written, the reconciler
    requeues it once this worker reports another job."""
    start = time.perf_counter()
    taken = retrying(lambda: take_turn(job_id, worker, serves, on_pick))
    if isinstance(taken, str):  # "misrouted", or "skipped" by a worker shutting down
        return taken
    if taken is None:
        log.info("no job waits in the queue of job %s (a duplicate or stale message); skipping", job_id)
        return "skipped"
    job_id, attempt = taken.job_id, taken.attempt
    try:
        return train(taken, worker, serves or [], claim_s=time.perf_counter() - start)
    except trainers.StopTraining as stop:
        if stop.reason == JobStatus.CANCELLED:
            return finish(job_id, attempt, JobStatus.CANCELLED)
        if stop.reason == "shutdown":
            return release(job_id, attempt)
        if stop.reason == "preempted":
            log.info("job %s gives its worker to a job of higher priority: %s", job_id, stop)
            return release(job_id, attempt, preempted=True)
        if isinstance(stop, Pruned):
            return finish(
                job_id,
                attempt,
                JobStatus.PRUNED,
                error={"type": JobStatus.PRUNED.value, "message": str(stop), "epoch": stop.epoch},
            )
        if stop.reason == "superseded":
            log.warning("job %s was handed to another worker; this attempt (%d) stops", job_id, attempt)
            return "superseded"
        if stop.reason == failures.FailureType.TIMEOUT:
            return fail(job_id, attempt, failures.Failure(failures.FailureType.TIMEOUT, str(stop)))
        return fail(job_id, attempt, failure_of(job_id, stop, worker))
    except Exception as exc:
        if is_transient(exc):  # the database stayed away past db_retry_s: not the job's fault
            log.warning(
                "job %s: the database was unavailable for %s s; handing the job back", job_id, get_settings().db_retry_s
            )
            return release(job_id, attempt)
        return fail(job_id, attempt, failure_of(job_id, exc, worker))


def failure_of(job_id: str, exc: BaseException, worker: dict | None = None) -> failures.Failure:
    """What the job's user is shown for `exc` (app/failures.classify, on the worker's hardware):
    a failure they can act on, with its own message; any other is `internal`, whose details
    (which may hold SQL, a server path or a driver's name) go to the worker's log under a
    reference, and the user sees only that reference."""
    failure = failures.classify(exc, (worker or {}).get("hardware", "cpu"))
    if failure is not None:
        log.warning("job %s failed (%s): %s %s", job_id, failure.type, exc, getattr(exc, "detail", ""))
        return failure
    reference = uuid.uuid4().hex[:12]
    log.error("job %s failed: internal error, reference %s", job_id, reference, exc_info=exc)
    return failures.internal(reference)


def fail(job_id: str, attempt: int, failure: failures.Failure) -> str:
    """End this attempt with `failure`: back to the queue when the retry policy retries its type
    and a retry is left (the job resumes from its checkpoint, `last_error` shows the failure),
    else failed with it."""
    allowed = get_settings().retries_for(failure.type)
    error = failure.as_error()

    def attempt_retry() -> bool:
        with session_scope() as session:
            if not lifecycle.retry(session, job_id, attempt, error, allowed):
                return False
            job = session.get(Job, job_id)
            assert job is not None  # retry just moved its row back to queued
            jobs.enqueue(session, job)  # broker away: the reconciler sends it later
            return True

    if allowed and retrying(attempt_retry):
        log.warning("job %s: %s, retried (TRAINHUB_RETRY_POLICY %s=%d)", job_id, failure.type, failure.type, allowed)
        return JobStatus.QUEUED
    return finish(job_id, attempt, JobStatus.FAILED, error=error)


def train(claimed: Claimed, worker: dict, serves: list[str], claim_s: float = 0.0) -> str:
    """Fit the claimed job, store its artifacts and end it succeeded. `claim_s`: the seconds its
    claim took (a timing of the job)."""
    job_id, attempt, claimed_at = claimed.job_id, claimed.attempt, claimed.claimed_at
    spec = validated_spec(claimed.spec)
    workdir = get_settings().resolved_artifact_dir() / job_id
    trial = retrying(lambda: _sweeps().TrialHook.of(claimed.job)) if claimed.job.sweep_id is not None else None
    hooks = JobHooks(job_id, attempt, spec.max_runtime_s, trial)
    if get_settings().preemption and serves:
        hooks.preemptible(
            scheduling.Running(job_id, PRIORITIES.index(spec.priority), claimed_at), spec.hardware, serves
        )
    dataset_file, data_timings = dataset_cache.fetch_for(spec)
    if spec.model.user_code:  # in a sandboxed child process; logs.txt is kept even when it fails
        try:
            result = user_code.fit(job_id, spec, workdir, hooks, dataset_file)
        except BaseException:
            retrying(lambda: store_artifacts(job_id, workdir, [user_code.LOG_FILE]))
            raise
    else:
        result = trainers.fit(spec, workdir, hooks.report, hooks.should_stop, run_options(dataset_file))
    artifacts_start = time.perf_counter()
    retrying(lambda: store_artifacts(job_id, workdir, result.artifacts))
    timings = {
        "queue_wait_s": _seconds(claimed.created_at, claimed_at),
        "claim_s": claim_s,
        **data_timings,
        **result.timings,
        "report_s": hooks.report_s,
        "artifacts_s": time.perf_counter() - artifacts_start,
        "total_s": _seconds(claimed_at, utcnow()),
    }
    worker = {
        **worker,
        "backend": result.device.get("backend"),
        "devices": result.device.get("devices", worker.get("devices")),
    }
    status = finish(
        job_id,
        attempt,
        JobStatus.SUCCEEDED,
        trial=claimed.job.sweep_id is not None,
        timings=timings,
        result=result.result,
        worker=worker,
    )
    from workers import comparisons  # (the parity check's reference; after the job)

    retrying(lambda: comparisons.settle(job_id))
    return status


def run_options(dataset_file: Path | None = None) -> trainers.RunOptions:
    """What the trainers need from this worker's Settings (and the uploaded dataset's cached
    file, when the job names one), passed explicitly."""
    settings = get_settings()
    return trainers.RunOptions(
        data_dir=settings.data_dir,
        compile_cache_dir=settings.resolved_compile_cache_dir(),
        compile_cache_max_bytes=settings.compile_cache_max_bytes,
        dataset_file=dataset_file,
        keep_programs=True,  # the next job of the same shape reuses this one's compiled programs
    )


def validated_spec(spec: dict) -> JobSpec:
    """The claimed job's stored spec, validated. Raises SpecNotRunnable (invalid_spec) when it
    does not validate here, e.g. on a worker of another version than the API."""
    try:
        return JobSpec.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        field = ".".join(str(part) for part in first["loc"]) or "spec"
        raise failures.SpecNotRunnable(
            f"the stored spec does not validate on this worker: {field}: {first['msg']}; fix it and "
            f"submit the job again ({exc.error_count()} error(s))"
        ) from None


class Pruned(trainers.StopTraining):
    """The sweep's pruner stopped the trial after `epoch` (its metrics are recorded)."""

    def __init__(self, epoch: int, reason: str) -> None:
        super().__init__(JobStatus.PRUNED, reason)
        self.epoch = epoch


@dataclass
class Claimed:
    """A job this worker claimed: its id, the claim's time and attempt number, and its row as the
    claim read it (spec, created_at, sweep_id and trial_number never change once stored)."""

    job_id: str
    claimed_at: datetime
    attempt: int
    job: Job

    @property
    def spec(self) -> dict:
        return self.job.spec

    @property
    def created_at(self) -> datetime:
        return self.job.created_at


def take_turn(
    turn_of: str, worker: dict, serves: list[str] | None, on_pick: Callable[[str], None] | None = None
) -> Claimed | str | None:
    """The turn of job `turn_of`'s message, in one session: "misrouted" when this worker does not
    serve its queue (misrouted()), "skipped" when the worker is shutting down (a worker on its way
    out claims nothing: it would release the job at once, so the turn goes back to its queue for
    another worker), None when no job waits, else the job claimed (claim()). The job's row is the
    one the turn read when the claimed job is that one (most often), else read once more."""
    with session_scope() as session:
        turn = session.get(Job, turn_of)
        if turn is None:
            return None
        if serves is not None and misrouted(session, turn, serves):
            return "misrouted"
        if shutting_down.is_set():
            queue.enqueue(turn.id, turn.queue)
            return "skipped"
        claimed = _claim_next(session, turn, worker, on_pick)
        if claimed is None:
            return None
        job_id, claimed_at, attempt = claimed
        job = turn if job_id == turn.id else session.get(Job, job_id)
        assert job is not None  # claimed just now, and jobs are never deleted
        return Claimed(job_id, claimed_at, attempt, job)


def misrouted(session: Session, job: Job, serves: list[str]) -> bool:
    """Whether this worker may not run the job. A message that reached a worker which cannot serve
    the job's `<hardware>.<framework>` (sent to the wrong queue by hand or by an older API) is
    never claimed: a gpu job must not quietly train on a cpu worker. The job stays queued and its
    id goes back to its own queue."""
    if job.queue in serves:
        return False
    log.warning(
        "job %s needs %s, which this worker (%s) does not serve; sending it back to its queue",
        job.id,
        job.queue,
        ", ".join(serves),
    )
    if job.status == JobStatus.QUEUED:
        jobs.enqueue(session, job)
    return True


def claim(turn_of: str, worker: dict, on_pick: Callable[[str], None] | None = None) -> tuple[str, datetime, int] | None:
    """Claim the job that runs next in the queue of job `turn_of` (app/scheduling.py):
    (its id, the claim time, the attempt number), or None when no job waits there (or `turn_of`
    is unknown). The claim is a compare-and-set from queued to running; when another worker
    claims the same job first, the next one is picked, until one is won or none waits."""
    with session_scope() as session:
        turn = session.get(Job, turn_of)
        if turn is None:
            return None
        return _claim_next(session, turn, worker, on_pick)


def _claim_next(
    session: Session, turn: Job, worker: dict, on_pick: Callable[[str], None] | None
) -> tuple[str, datetime, int] | None:
    its_queue = (turn.hardware, turn.framework, turn.devices)
    while (job_id := scheduling.next_job(session, *its_queue)) is not None:
        if on_pick is not None:
            on_pick(job_id)
        now = utcnow()
        if (attempt := lifecycle.claim(session, job_id, worker, now)) is not None:
            return job_id, now, attempt
    return None


class JobHooks:
    """The trainer's callbacks for one job: record each epoch, honour cancel and max_runtime_s,
    and for a sweep's trial report the epoch's objective and stop when the pruner says so."""

    def __init__(
        self, job_id: str, attempt: int, max_runtime_s: float | None, trial: sweeps.TrialHook | None = None
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.trial = trial
        self.deadline = time.monotonic() + max_runtime_s if max_runtime_s else None
        self.max_runtime_s = max_runtime_s
        # The claim has just seen the row: the first look at its flags is due CANCEL_POLL_S on.
        self.last_poll = time.monotonic()
        self.report_s = 0.0  # seconds spent storing epochs and looking at the flags after them
        self.preemption: tuple[scheduling.Running, str, list[str]] | None = None
        self.last_preempt_check = time.monotonic()

    def preemptible(self, job: scheduling.Running, hardware: str, serves: list[str]) -> None:
        """Give the worker to a waiting job of higher priority when app/scheduling.py says so."""
        self.preemption = (job, hardware, serves)

    def report(self, epoch: int, metrics: trainers.EpochMetrics) -> None:
        """Store the epoch's metrics (once, even if reported again) and the job's progress; retried
        through a database outage (training waits for it). The progress' UPDATE returns the flags
        should_stop looks at, so a cancel is seen here without another read."""
        start = time.perf_counter()
        try:
            flags = retrying(lambda: self._record(epoch, metrics))
            self.should_stop(force=True, flags=flags if flags is not None else _LOST)
        finally:
            self.report_s += time.perf_counter() - start
        if self.trial is not None:
            trial = self.trial
            reason = retrying(lambda: trial.after_epoch(epoch, metrics.to_dict()))
            if reason is not None:
                raise Pruned(epoch, reason)

    def _record(self, epoch: int, metrics: trainers.EpochMetrics) -> Any:
        """Two statements: the metrics row (skipped when the epoch is stored already: a replay
        after a checkpoint) and the progress, with the row's flags after it (None: lost)."""
        dialect = postgresql if get_engine().dialect.name == "postgresql" else sqlite
        with session_scope() as session:
            added = session.execute(
                dialect.insert(EpochMetric)
                .values(job_id=self.job_id, **metrics.to_dict())
                .on_conflict_do_nothing(index_elements=["job_id", "epoch"])
            )
            if not added.rowcount:  # type: ignore[attr-defined]  # DML gives a CursorResult
                log.info("job %s epoch %d was already recorded", self.job_id, epoch)
            return lifecycle.record_epoch_flags(session, self.job_id, self.attempt, epoch)

    def should_stop(self, force: bool = False, flags: Any = None) -> None:
        """Raise StopTraining when the job was cancelled, ran past max_runtime_s, was handed
        to another worker, or this worker is shutting down."""
        if shutting_down.is_set():
            raise trainers.StopTraining("shutdown", "the worker is shutting down")
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise trainers.StopTraining("timeout", failures.timeout(self.max_runtime_s).message)
        now = time.monotonic()
        if not force and now - self.last_poll < CANCEL_POLL_S:
            return
        self.last_poll = now
        row = flags
        try:
            if row is None:
                row = self._read_flags()
        except Exception as exc:
            if not is_transient(exc):
                raise
            # Only a look at the flags: training goes on, and looks again at the next chunk (the
            # epoch's record is what waits for the database).
            log.warning("job %s: cannot read its cancel flag (%s); training goes on", self.job_id, type(exc).__name__)
            return
        if row is _LOST:
            raise trainers.StopTraining("superseded", "the job was handed to another worker")
        if row.cancel_requested:
            raise trainers.StopTraining(JobStatus.CANCELLED, "cancelled by the user")
        if row.status != JobStatus.RUNNING or row.attempts != self.attempt:
            raise trainers.StopTraining("superseded", "the job was handed to another worker")
        if self.preemption is not None and now - self.last_preempt_check >= PREEMPT_POLL_S:
            self.last_preempt_check = now
            if (waiting := self._waiting_for_worker()) is not None:
                raise trainers.StopTraining("preempted", f"job {waiting} of higher priority waits for this worker")

    def _waiting_for_worker(self) -> str | None:
        assert self.preemption is not None
        job, hardware, serves = self.preemption
        since = utcnow() - timedelta(seconds=get_settings().worker_timeout_s)
        try:
            with session_scope() as session:
                return scheduling.preempting(session, job, hardware, serves, since)
        except Exception as exc:  # only a look: training goes on, and looks again later
            if not is_transient(exc):
                raise
            return None

    def _read_flags(self) -> Any:
        with session_scope() as session:
            return session.execute(
                select(Job.cancel_requested, Job.status, Job.attempts).where(Job.id == self.job_id)
            ).one()


def store_artifacts(job_id: str, workdir: Path, names: list[str]) -> None:
    """Put each file the trainer wrote into the artifact store (app/storage.py: the artifact dir
    or an S3 bucket) and record where, with its size and sha256; never twice."""
    store = storage.get_store()
    with session_scope() as session:
        known = set(session.scalars(select(Artifact.name).where(Artifact.job_id == job_id)))
        for name in names:
            if name in known:
                continue
            path = workdir / name
            location = store.put(job_id, name, path)  # stored before recorded: a row always has its file
            session.add(
                Artifact(
                    job_id=job_id, name=name, size_bytes=path.stat().st_size, sha256=sha256_file(path), path=location
                )
            )
        session.commit()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def release(job_id: str, attempt: int, preempted: bool = False) -> str:
    """Put a job this worker stops (on shutdown, after a database outage, or `preempted` by a job
    of higher priority) back in its queue (lifecycle.release); the next attempt resumes from the
    last checkpoint: on shutdown or preemption, the trainer wrote one at the chunk where it
    stopped (trainers.base.HAND_BACK_REASONS). A cancel that came meanwhile ends it cancelled."""

    def attempt_release() -> JobStatus | None:
        with session_scope() as session:
            status = lifecycle.release(session, job_id, attempt, preempted=preempted)
            if status == JobStatus.QUEUED:
                job = session.get(Job, job_id)
                assert job is not None  # release just moved its row back to queued
                jobs.enqueue(session, job)  # broker away: the reconciler sends it later
            return status

    status = retrying(attempt_release)
    log.info("job %s %s", job_id, "released" if status == JobStatus.QUEUED else status)
    if status == JobStatus.CANCELLED:
        storage.drop_checkpoint(job_id)
    return status or JobStatus.QUEUED


def finish(job_id: str, attempt: int, status: JobStatus, trial: bool = True, **values: object) -> str:
    """End this attempt of the job with `status`, unless the job has moved on without it. A value
    that cannot be stored (not strict JSON) fails the job as internal rather than leaving it running.
    `trial`: whether the job may be a sweep's trial, whose sweep then takes its turn (False: it is
    known not to be, and the sweep's look-up is saved)."""

    def attempt_finish() -> bool:
        with session_scope() as session:
            return lifecycle.finish(session, job_id, attempt, status, **values)

    try:
        ended = retrying(attempt_finish)
    except (ValueError, StatementError) as exc:  # e.g. a NaN in timings or result: JSON has none
        if is_transient(exc):
            raise  # the database stayed away: the reconciler requeues the job
        values = {"error": failure_of(job_id, exc).as_error()}
        status = JobStatus.FAILED
        ended = retrying(attempt_finish)
    log.info("job %s %s", job_id, status)
    if ended:
        storage.drop_checkpoint(job_id)
    if not trial:
        return status
    try:
        retrying(lambda: _sweeps().settle(job_id))
    except Exception:  # the reconciler takes the sweep's turn later
        log.exception("job %s: its sweep's turn failed; the reconciler takes it later", job_id)
    return status


def _sweeps():  # type: ignore[no-untyped-def]  # the module, typed as app.sweeps.service
    from app.sweeps import service

    return service


# should_stop's flags when the progress' UPDATE found the row owned by another attempt.
_LOST = object()


def _seconds(start: datetime, end: datetime) -> float:
    # SQLite hands back naive datetimes; both ends are UTC.
    if start.tzinfo is None or end.tzinfo is None:
        start, end = start.replace(tzinfo=None), end.replace(tzinfo=None)
    return round((end - start).total_seconds(), 6)
