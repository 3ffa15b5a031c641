"""Sweeps: created, advanced, their trials reported and pruned, cancelled, found and rendered.

A sweep's trials are ordinary jobs (Job.sweep_id, trial_number, trial_params). `advance` is the
one place that starts trials and ends sweeps. It runs under the sweep's row lock, so one process
at a time takes the sweep's turn, and it is safe to call from anywhere at any time: the API
calls it at creation, a worker after each trial's job ends, and the reconciler for every running
sweep. Each turn first brings the study in line with the jobs (an ended job's trial is told to
Optuna; a trial Optuna started but whose job was never stored, because its process died between
the two, is failed), so a crash anywhere loses no trial and starts none twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from app import jobs, limits, pages
from app.config import get_settings
from app.db import session_scope
from app.keys import Caller
from app.models import Comparison, Job, Sweep, utcnow
from app.status import ACTIVE, JobStatus, SweepStatus
from app.sweeps import lifecycle, study
from app.sweeps.spec import Budget, SweepSpec, Trial, TrialCounts
from app.sweeps.spec import Sweep as SweepOut
from app.sweeps.validate import trial_spec
from trainers.spec import ComparisonSpec, JobSpec

log = logging.getLogger(__name__)

# How a trial's job ended, as the study's TrialState.
ENDED_AS = {
    JobStatus.SUCCEEDED: "COMPLETE",
    JobStatus.PRUNED: "PRUNED",
    JobStatus.FAILED: "FAIL",
    JobStatus.CANCELLED: "FAIL",
}


def create_sweep(session: Session, owner: Caller, spec: SweepSpec, base: dict[str, Any]) -> Sweep:
    """Store the sweep (its spec with the resolved `base`), create its study, queue its first
    trials. Raises limits.QuotaExceeded when the key has no room for them."""
    first = min(spec.parallelism, spec.max_trials) * len(spec.frameworks or [base["framework"]])
    if limits.queued_room(session, owner) < first:
        raise limits.QuotaExceeded(
            f"this sweep starts {first} job(s) at once, more than this key may still queue (limit "
            f"max_queued_jobs_per_key = {get_settings().max_queued_jobs_per_key}, set by "
            "TRAINHUB_MAX_QUEUED_JOBS_PER_KEY): lower parallelism, or wait for queued jobs to start"
        )
    stored = spec.model_copy(update={"base": base})
    sweep = Sweep(owner_id=owner.id, name=spec.name, spec=stored.model_dump(mode="json"), status=SweepStatus.RUNNING)
    session.add(sweep)
    session.flush()
    try:
        study.create(sweep.id, stored)
    except Exception:
        session.rollback()  # no sweep without its study: it could never start a trial
        raise
    session.commit()
    advance(sweep.id)
    session.refresh(sweep)
    return sweep


def advance(sweep_id: str) -> None:
    """Take the sweep's turn (see the module docstring): sync the study with the trials' jobs;
    then, while it runs, end it when no trial is active and none may start, or queue new trials
    up to its parallelism, its max_trials, its max_total_s and the key's queued-jobs quota."""
    new: list[Job] = []
    with session_scope() as session:
        status = lifecycle.take_turn(session, sweep_id)
        if status is None:
            return
        sweep = session.get(Sweep, sweep_id)
        assert sweep is not None  # take_turn found it
        spec = SweepSpec.model_validate(sweep.spec)
        trials = grouped(session.scalars(select(Job).where(Job.sweep_id == sweep_id)))
        _sync(sweep_id, spec, trials)
        if status != SweepStatus.RUNNING:
            session.commit()
            return
        active = sum(trial_status(group) in ACTIVE for group in trials.values())
        spent = _budget_spent(spec, trials)
        wanted = 0 if spent else min(spec.parallelism - active, spec.max_trials - len(trials))
        if spec.method == "grid":
            wanted = min(wanted, spec.grid_size() - len(trials))
        if wanted <= 0 and active == 0:
            completed = any(trial_status(group) == JobStatus.SUCCEEDED for group in trials.values())
            done = SweepStatus.SUCCEEDED if completed else SweepStatus.FAILED
            lifecycle.finish(session, sweep_id, done)
            session.commit()
            log.info("sweep %s %s after %d trial(s)", sweep_id, done, len(trials))
            return
        owner = Caller(id=sweep.owner_id, is_admin=False)
        frameworks = spec.frameworks or [spec.base["framework"]]
        limits.lock_key(session, owner)  # until the commit: the key's POST /jobs and turns count in turn
        room = limits.queued_room(session, owner) // len(frameworks)
        for _ in range(max(0, min(wanted, room))):
            new.extend(_new_trial(session, sweep, spec, owner, frameworks))
        session.commit()
        for job in new:
            jobs.enqueue(session, job)


def _new_trial(session: Session, sweep: Sweep, spec: SweepSpec, owner: Caller, frameworks: Sequence[str]) -> list[Job]:
    """Ask the study for a trial and store its job in each framework, with a comparison when
    there are two (flushed, not committed)."""
    number, params = study.ask(sweep.id, spec)
    body = trial_spec(spec.base, params)
    label = spec.name or spec.base.get("name") or f"sweep {sweep.id[:8]}"
    body["name"] = f"{label} trial {number}"[:200]
    made = []
    for framework in frameworks:
        job_spec = limits.apply_limits(JobSpec.model_validate({**body, "framework": framework}))
        job = jobs.new_job(owner, JobSpec.model_validate(job_spec.model_dump()))
        job.sweep_id, job.trial_number, job.trial_params = sweep.id, number, params
        made.append(job)
    session.add_all(made)
    session.flush()
    if len(made) == 2:
        by_framework = {job.framework: job for job in made}
        pair = ComparisonSpec.model_validate(
            {k: v for k, v in made[0].spec.items() if k not in ("framework", "compile")}
        )
        session.add(
            Comparison(
                owner_id=owner.id,
                spec=pair.model_dump(mode="json"),
                jax_job_id=by_framework["jax"].id,
                pytorch_job_id=by_framework["pytorch"].id,
                created_at=made[0].created_at,
            )
        )
        session.flush()
    return made


def grouped(found: Iterable[Job]) -> dict[int, list[Job]]:
    """The sweep's jobs by trial number (one job a trial, or one per framework), in order."""
    trials: dict[int, list[Job]] = {}
    for job in sorted(found, key=lambda j: (j.trial_number or 0, j.framework)):
        trials.setdefault(job.trial_number or 0, []).append(job)
    return trials


def trial_status(group: list[Job]) -> JobStatus:
    """A trial's status from its jobs': running or queued while one is; then pruned when one
    was pruned (its pair is stopped too), failed or cancelled when one was, else succeeded."""
    statuses = {JobStatus(job.status) for job in group}
    for status in (JobStatus.RUNNING, JobStatus.QUEUED, JobStatus.PRUNED, JobStatus.FAILED, JobStatus.CANCELLED):
        if status in statuses:
            return status
    return JobStatus.SUCCEEDED


def _sync(sweep_id: str, spec: SweepSpec, trials: dict[int, list[Job]]) -> None:
    """Tell the study how each ended trial ended, and fail the trials it started that have no
    job (their process died between the two)."""
    try:
        frozen = {t.number: t for t in study.trials(sweep_id)}
    except KeyError:  # the API stored the sweep but died before creating its study
        study.create(sweep_id, spec)
        frozen = {}
    for number, group in trials.items():
        trial = frozen.get(number)
        status = trial_status(group)
        if trial is None or trial.state.is_finished() or status in ACTIVE:
            continue
        state = ENDED_AS[status]
        value = objective_value(spec, group) if state == "COMPLETE" else None
        if state == "COMPLETE" and value is None:
            state = "FAIL"  # succeeded without a finite objective: not a result to rank
        study.tell(sweep_id, spec, number, state, value)
    for number, trial in frozen.items():
        if not trial.state.is_finished() and number not in trials:
            log.warning("sweep %s trial %d was started but its job never stored; failing it", sweep_id, number)
            study.tell(sweep_id, spec, number, "FAIL")


def _budget_spent(spec: SweepSpec, trials: dict[int, list[Job]]) -> bool:
    return spec.max_total_s is not None and train_seconds(trials) >= spec.max_total_s


def train_seconds(trials: dict[int, list[Job]]) -> float:
    """The trials' summed train time (seconds): every epoch each of their jobs has run."""
    return round(sum(m.epoch_time_s for group in trials.values() for job in group for m in job.metrics), 3)


def job_objective(spec: SweepSpec, job: Job, epoch: int | None = None) -> float | None:
    """The objective of the job at `epoch` (default: its last recorded one); None when it has
    none there (or it is not finite)."""
    rows = [m for m in job.metrics if epoch is None or m.epoch == epoch]
    if not rows:
        return None
    value = getattr(rows[-1], spec.objective.metric)
    return float(value) if value is not None and math.isfinite(value) else None


def objective_value(spec: SweepSpec, group: list[Job]) -> float | None:
    """A trial's objective: its job's at its last epoch, or the mean of its two jobs' at the last
    epoch both ran (a pair pruned at epoch 1 while the other ran on is judged at epoch 1); None
    unless each has one."""
    common = min(job.epoch for job in group) if len(group) > 1 else None
    values = [job_objective(spec, job, common) for job in group]
    if not values or any(v is None for v in values):
        return None
    return sum(values) / len(values)  # type: ignore[arg-type]


# --- from the worker, while a trial runs -----------------------------------------------------------


class TrialHook:
    """What a trial's job asks its sweep after each epoch: report the objective, and whether to
    stop (the pruner's answer). A trial in both frameworks reports the mean of its two jobs'
    objectives at an epoch once both have run it, and a job stops when its pair was pruned."""

    def __init__(self, job_id: str, sweep_id: str, number: int, spec: SweepSpec, epochs: int) -> None:
        self.job_id, self.sweep_id, self.number, self.spec, self.epochs = job_id, sweep_id, number, spec, epochs
        self.paired = bool(spec.frameworks and len(spec.frameworks) == 2)

    @classmethod
    def of(cls, job: Job) -> TrialHook | None:
        if job.sweep_id is None or job.trial_number is None:
            return None
        with session_scope() as session:
            sweep = session.get(Sweep, job.sweep_id)
            assert sweep is not None  # a trial's sweep is never deleted before it
            return cls(job.id, sweep.id, job.trial_number, SweepSpec.model_validate(sweep.spec), job.epochs)

    def after_epoch(self, epoch: int, metrics: dict[str, Any]) -> str | None:
        """Report the epoch's objective; the reason to stop the trial now, or None (never after
        its last epoch: it has ended anyway)."""
        metric = self.spec.objective.metric
        value = metrics.get(metric)
        if value is None or not math.isfinite(value):
            return None
        if self.paired:
            with session_scope() as session:
                pair = session.scalars(
                    select(Job).where(
                        Job.sweep_id == self.sweep_id, Job.trial_number == self.number, Job.id != self.job_id
                    )
                ).one()
                if pair.status == JobStatus.PRUNED:
                    stopped_at = (pair.error or {}).get("epoch", pair.epoch)
                    return f"its {pair.framework} pair was pruned after epoch {stopped_at}"
                other = job_objective(self.spec, pair, epoch)
            if other is None:
                return None  # the pair reports the mean when it reaches this epoch
            value, metric = (value + other) / 2, f"the mean {metric} of both frameworks"
        stop = study.report(self.sweep_id, self.spec, self.number, epoch, float(value))
        if not stop or epoch >= self.epochs:
            return None
        stopping = self.spec.early_stopping
        assert stopping is not None  # only a pruner stops a trial
        if stopping.method == "median":
            why = "below the median of the earlier trials at that epoch"
        else:
            why = f"not among the best 1/{stopping.reduction_factor} of the trials that reached that epoch"
        return f"pruned by {stopping.method} after epoch {epoch}: {metric} {value:.4g} was {why}"


def settle(job_id: str) -> None:
    """After a job ends: when it is a sweep's trial, take the sweep's turn."""
    with session_scope() as session:
        sweep_id = session.scalar(select(Job.sweep_id).where(Job.id == job_id))
    if sweep_id is not None:
        advance(sweep_id)


# The reconciler takes the turn of a running sweep nobody took it for this long (seconds): a
# sweep whose trials end take turns of their own; one left behind by a crash waits this long.
IDLE_TURN_S = 10.0


def advance_running() -> None:
    """Take the turn of every running sweep whose last turn is older than IDLE_TURN_S (the
    reconciler: repairs what a crash left undone)."""
    idle_since = utcnow() - timedelta(seconds=IDLE_TURN_S)
    with session_scope() as session:
        running = list(
            session.scalars(
                select(Sweep.id).where(
                    Sweep.status == SweepStatus.RUNNING,
                    or_(Sweep.advanced_at.is_(None), Sweep.advanced_at < idle_since),
                )
            )
        )
    for sweep_id in running:
        try:
            advance(sweep_id)
        except Exception:
            log.exception("sweep %s: its turn failed; the next reconcile tries again", sweep_id)


# --- from the API ------------------------------------------------------------------------------


def get_sweep(session: Session, owner: Caller, sweep_id: str) -> Sweep | None:
    """The owner's sweep (any for an admin key) by id or short id, as jobs.find_owned; else None."""
    return jobs.find_owned(session, owner, Sweep, sweep_id)


def list_sweeps(
    session: Session, owner: Caller, limit: int, cursor: str | None = None
) -> tuple[list[Sweep], str | None]:
    """The owner's sweeps (every sweep for an admin key), newest first: a page of `limit` after
    `cursor`, and the next page's cursor (app.pages). Raises ValueError for a cursor this API did
    not hand out."""
    query = select(Sweep) if owner.is_admin else select(Sweep).where(Sweep.owner_id == owner.id)
    return pages.page(session, query, Sweep, limit, cursor)


def cancel_sweep(session: Session, sweep: Sweep) -> None:
    """End the sweep cancelled and cancel every trial still queued or running; a trial that
    already ended stays as it ended."""
    lifecycle.cancel(session, sweep.id)
    for job in session.scalars(select(Job).where(Job.sweep_id == sweep.id, Job.status.in_(ACTIVE))):
        try:
            jobs.cancel_job(session, job)
        except jobs.CannotCancel:
            pass
    advance(sweep.id)  # queued trials ended at once: the study learns of them now
    session.refresh(sweep)


def trial_jobs(session: Session, sweep_id: str) -> dict[int, list[Job]]:
    """The sweep's jobs by trial number, in order."""
    return grouped(session.scalars(select(Job).where(Job.sweep_id == sweep_id)))


def trials(session: Session, spec: SweepSpec, found: dict[int, list[Job]]) -> list[Trial]:
    """The sweep's trials as the HTTP Trial, in order."""
    jax_ids = [job.id for group in found.values() for job in group if len(group) == 2 and job.framework == "jax"]
    pairs = dict(
        session.execute(select(Comparison.jax_job_id, Comparison.id).where(Comparison.jax_job_id.in_(jax_ids))).all()
        if jax_ids
        else ()
    )
    made = []
    for number, group in found.items():
        status = trial_status(group)
        pruned = [job for job in group if job.status == JobStatus.PRUNED]
        made.append(
            Trial(
                number=number,
                params=group[0].trial_params or {},
                job_id=group[0].id,
                jobs={job.framework: job.id for job in group},
                comparison_id=next((pairs[job.id] for job in group if job.id in pairs), None),
                status=status,
                objective=objective_value(spec, group),
                epochs=min(job.epoch for job in group),
                pruned_at_epoch=(pruned[0].error or {}).get("epoch", pruned[0].epoch) if pruned else None,
            )
        )
    return made


def render(
    session: Session, sweep: Sweep, found: dict[int, list[Job]] | None = None, listed: list[Trial] | None = None
) -> SweepOut:
    """The sweep's HTTP answer: counts of its trials by status, the best completed one, budget.
    `found` (trial_jobs) and `listed` (trials): when the caller has them already."""
    spec = SweepSpec.model_validate(sweep.spec)
    found = found if found is not None else trial_jobs(session, sweep.id)
    listed = listed if listed is not None else trials(session, spec, found)
    counts: dict[str, int] = {}
    for t in listed:
        counts[t.status] = counts.get(t.status, 0) + 1
    ranked = [t for t in listed if t.status == JobStatus.SUCCEEDED and t.objective is not None]
    sign = 1 if spec.objective.direction == "max" else -1
    best = max(ranked, key=lambda t: sign * t.objective, default=None)  # type: ignore[operator]
    return SweepOut(
        id=sweep.id,
        status=SweepStatus(sweep.status),
        name=sweep.name,
        spec=spec,
        created_at=sweep.created_at,
        finished_at=sweep.finished_at,
        trials=TrialCounts(**counts),
        best=best,
        best_spec=found[best.number][0].spec if best is not None else None,
        budget=Budget(
            trials=len(found), max_trials=spec.max_trials, train_s=train_seconds(found), max_total_s=spec.max_total_s
        ),
    )
