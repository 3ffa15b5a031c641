"""Which queued job of a queue runs next: priorities, a fair share across keys, where a job
stands, and which running job gives its worker to a higher-priority one.

Every queue (`<hardware>.<framework>[.x<devices>]`) is shared by every key. Its jobs are taken
by priority (spec.priority: every high job before every normal one, normal before low). Within
a level, taken in order of arrival one key's hundred week-long jobs would hold it for months;
instead the next job is taken round robin across the keys with jobs waiting at that level, in
this order (`turns`):

1. the key with the fewest jobs running in this queue;
2. then the key served here longest ago (its latest claim in the queue; never served: first);
3. then the key whose oldest queued job is oldest;

and of that key, its oldest queued job (`next_job`). A broker message is a turn in its queue,
not an order to run its own job: the worker that takes one claims the job this order names, so
a queue holds as many turns as queued jobs and none is lost when a job is taken out of turn
(workers/runner.py; the reconciler counts turns the same way).

`position` follows the same order: every queued job of a higher level first, then round by
round within the job's level: the first queued job of every key in turn order, then every key's
second, and so on. Jobs that end sooner or later than others reorder later rounds, so a position
past the first round is the best estimate, not a promise.

`preempting` says when a running job should give its worker back (see its docstring).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import Row, and_, bindparam, func, literal, null, or_, select, union_all
from sqlalchemy.orm import Session, aliased

from app.models import Job, Worker, aware
from app.queue import queue_name
from app.status import JobStatus

_QUEUED = JobStatus.QUEUED.value


@dataclass(frozen=True)
class Turn:
    """A key with jobs waiting in a queue: how many (`queued`), since when (`head`, its oldest
    queued job's created_at), how many it runs there now, when it was last served there, and
    (`before`) how many of its queued jobs came before the job a position is asked for."""

    owner_id: str
    queued: int
    head: datetime
    running: int
    last_claimed: datetime | None
    before: int = 0
    higher: int = 0  # queued jobs of the queue at higher priority levels

    def order(self) -> tuple:
        never = datetime.min.replace(tzinfo=self.head.tzinfo)
        return (self.running, self.last_claimed or never, self.head, self.owner_id)


def _in_queue(job: type[Job] | Job) -> tuple:
    return (
        job.hardware == bindparam("hardware"),
        job.framework == bindparam("framework"),
        job.devices == bindparam("devices"),
    )


# Built once: every claim, and every look at a queued job, runs it. Each part reads an index:
# the queued jobs of the queue by key (ix_jobs_queued_by_owner), each waiting key's running jobs
# (ix_jobs_owner_status_created) and its latest claim in the queue (ix_jobs_owner_queue_started).
# `before`: each key's queued jobs created before the one asked about (at the same instant the
# id breaks the tie, as in the job list): for that job's key, the jobs of its own ahead of it.
_BEFORE = or_(
    Job.created_at < bindparam("created_at"), and_(Job.created_at == bindparam("created_at"), Job.id < bindparam("id"))
)
_waiting = (
    select(
        Job.owner_id,
        func.count().label("waiting"),
        func.min(Job.created_at).label("head"),
        func.count().filter(_BEFORE).label("before"),
    )
    .where(Job.status == _QUEUED, *_in_queue(Job), Job.priority == bindparam("priority"))
    .group_by(Job.owner_id)
    .subquery()
)
_other = aliased(Job)
_TURNS = select(
    _waiting.c.owner_id,
    _waiting.c.waiting,
    _waiting.c.head,
    _waiting.c.before,
    select(func.count())
    .where(_other.owner_id == _waiting.c.owner_id, _other.status == JobStatus.RUNNING.value, *_in_queue(_other))
    .scalar_subquery()
    .label("busy"),
    select(func.max(_other.started_at))
    .where(_other.owner_id == _waiting.c.owner_id, *_in_queue(_other))
    .scalar_subquery()
    .label("last_claimed"),
    # the same in every row: the queued jobs of the higher levels
    select(func.count())
    .where(_other.status == _QUEUED, *_in_queue(_other), _other.priority > bindparam("priority"))
    .scalar_subquery()
    .label("higher"),
)
_OLDEST_OF_OWNER = (
    select(Job.id)
    .where(
        Job.status == _QUEUED,
        Job.owner_id == bindparam("owner_id"),
        *_in_queue(Job),
        Job.priority == bindparam("priority"),
    )
    .order_by(Job.created_at, Job.id)
    .limit(1)
)
# A key's jobs running in the queue and its latest claim there, as _TURNS reads them: each from
# its index (ix_jobs_owner_status_created, ix_jobs_owner_queue_started), never the key's whole history
# in the queue (one aggregate over both would read every job it ever ran there).
_STANDING = select(
    select(func.count())
    .where(Job.owner_id == bindparam("owner_id"), Job.status == JobStatus.RUNNING.value, *_in_queue(Job))
    .scalar_subquery(),
    select(func.max(Job.started_at)).where(Job.owner_id == bindparam("owner_id"), *_in_queue(Job)).scalar_subquery(),
)
# _TURNS, and after its rows one row for each job of `ids`: its rank among its key's queued jobs
# at the level (1: its key's oldest, in the order of _BEFORE) as `waiting`, its id as `job_id`
# (None in the turns' rows). One statement, so one snapshot: the turns and the ranks of a page's
# jobs agree even while jobs of the queue are taken or cancelled.
_ranked = (
    select(
        Job.id,
        Job.owner_id,
        func.row_number().over(partition_by=Job.owner_id, order_by=(Job.created_at, Job.id)).label("rank"),
    )
    .where(
        Job.status == _QUEUED,
        *_in_queue(Job),
        Job.priority == bindparam("priority"),
        Job.owner_id.in_(bindparam("owners", expanding=True)),
    )
    .subquery()
)
_TURNS_AND_RANKS = union_all(
    _TURNS.add_columns(null().label("job_id")),
    select(_ranked.c.owner_id, _ranked.c.rank, null(), literal(0), literal(0), null(), literal(0), _ranked.c.id).where(
        _ranked.c.id.in_(bindparam("ids", expanding=True))
    ),
)
_TOP_LEVEL = select(func.max(Job.priority)).where(Job.status == _QUEUED, *_in_queue(Job))
_HIGHER = select(func.count()).where(Job.status == _QUEUED, *_in_queue(Job), Job.priority > bindparam("priority"))


def _queue(hardware: str, framework: str, devices: int) -> dict:
    return {"hardware": hardware, "framework": framework, "devices": devices}


def turns(
    session: Session, hardware: str, framework: str, devices: int, priority: int, job: Job | None = None
) -> list[Turn]:
    """The keys with jobs queued at `priority` in the queue, the one served next first; with
    `job`, each turn's `before` counts the key's queued jobs created before it."""
    moment = (job.created_at, job.id or "") if job is not None else (datetime.max.replace(tzinfo=UTC), "")
    params = {**_queue(hardware, framework, devices), "priority": priority, "created_at": moment[0], "id": moment[1]}
    return sorted(map(_turn, session.execute(_TURNS, params)), key=Turn.order)


def _turn(row: Row) -> Turn:
    return Turn(
        row.owner_id,
        row.waiting,
        aware(row.head),
        row.busy,
        aware(row.last_claimed) if row.last_claimed else None,
        row.before,
        row.higher,
    )


def next_job(session: Session, hardware: str, framework: str, devices: int = 1) -> str | None:
    """The id of the queued job of the queue that runs next, or None when none waits."""
    queue = _queue(hardware, framework, devices)
    level = session.scalar(_TOP_LEVEL, queue)
    if level is None:
        return None
    waiting = turns(session, hardware, framework, devices, level)
    return session.scalar(_OLDEST_OF_OWNER, {**queue, "priority": level, "owner_id": waiting[0].owner_id})


def position(session: Session, job: Job) -> int:
    """1 when `job` (queued, stored or about to be) runs next in its queue, 2 when one job comes
    first, and so on, by the order of the module docstring. One query (three for its key's first
    job of a level, not yet stored)."""
    queue = _queue(job.hardware, job.framework, job.devices or 1)
    level = _level(job)
    waiting = turns(session, **queue, priority=level, job=job)
    higher = waiting[0].higher if waiting else session.scalar(_HIGHER, {**queue, "priority": level}) or 0
    own = next((turn for turn in waiting if turn.owner_id == job.owner_id), None)
    if own is None:  # its key's first queued job at its level, not yet stored: where its key stands
        busy, last = session.execute(_STANDING, {**queue, "owner_id": job.owner_id}).one()
        own = Turn(job.owner_id, 1, aware(job.created_at), busy or 0, aware(last) if last else None, 0)
        waiting = sorted([*waiting, own], key=Turn.order)
    return higher + _ahead(waiting, own, own.before + 1) + 1


def positions(session: Session, queued: Sequence[Job]) -> dict[str, int]:
    """`position` of each stored queued job of `queued` (a page of a job list), by id: one query
    for each (queue, level) the jobs wait at, however many jobs, instead of one a job. A job that
    was taken (or whose key left the queue) since it was read gets `position`'s answer."""
    groups: dict[tuple, list[Job]] = defaultdict(list)
    for job in queued:
        groups[(job.hardware, job.framework, job.devices or 1, _level(job))].append(job)
    found: dict[str, int] = {}
    for (hardware, framework, devices, level), members in groups.items():
        params = {
            **_queue(hardware, framework, devices),
            "priority": level,
            "created_at": datetime.max.replace(tzinfo=UTC),
            "id": "",
            "owners": sorted({job.owner_id for job in members}),
            "ids": [job.id for job in members],
        }
        rows = session.execute(_TURNS_AND_RANKS, params).all()
        waiting = sorted((_turn(row) for row in rows if row.job_id is None), key=Turn.order)
        ranks = {row.job_id: row.waiting for row in rows if row.job_id is not None}
        by_owner = {turn.owner_id: turn for turn in waiting}
        for job in members:
            own = by_owner.get(job.owner_id)
            if own is None or job.id not in ranks:
                found[job.id] = position(session, job)
            else:
                found[job.id] = waiting[0].higher + _ahead(waiting, own, ranks[job.id]) + 1
    return found


def _level(job: Job) -> int:
    return job.priority if job.priority is not None else 1


def _ahead(waiting: list[Turn], own: Turn, rank: int) -> int:
    """The jobs of `waiting` (the turns of one level, in order) that run before the `rank`-th
    queued job of `own`'s key: every key's jobs of the earlier rounds, and this round's of the
    keys whose turn comes before its key's."""
    own_turn = waiting.index(own)
    ahead = rank - 1
    for index, turn in enumerate(waiting):
        if turn is not own:
            ahead += min(turn.queued, rank - 1) + (turn.queued >= rank and index < own_turn)
    return ahead


@dataclass(frozen=True)
class Running:
    """A running job as `preempting` weighs it."""

    id: str
    priority: int
    started_at: datetime | None


def preempting(session: Session, job: Running, hardware: str, serves: list[str], online_since: datetime) -> str | None:
    """The id of the queued job that the running `job` (on a worker serving the queues `serves`
    of `hardware`) should give its worker to, or None.

    A job of higher priority waiting in one of those queues takes a worker when no online
    worker (heartbeat after `online_since`, broker reachable) serving its queue is free (a
    worker whose job is no longer running counts as free: it just gave it back). Then, of the
    running jobs of lower priority on the workers serving its queue, the one of lowest priority
    and, among those, the last started (the least work to redo) gives its worker; one running
    job for each waiting one, the waiting jobs taken in the order the queue runs them."""
    waiting = [
        w
        for w in session.execute(
            select(Job.id, Job.hardware, Job.framework, Job.devices, Job.priority)
            .where(Job.status == _QUEUED, Job.hardware == hardware, Job.priority > job.priority)
            .order_by(Job.priority.desc(), Job.created_at, Job.id)
        )
        if queue_name(w.hardware, w.framework, w.devices) in serves
    ]
    if not waiting:
        return None
    workers = list(
        session.execute(
            select(Worker.queues, Worker.current_job_id).where(Worker.last_seen >= online_since, Worker.broker_ok)
        )
    )
    current = [w.current_job_id for w in workers if w.current_job_id]
    running = (
        {
            r.id: Running(r.id, r.priority, r.started_at)
            for r in session.execute(
                select(Job.id, Job.priority, Job.started_at).where(
                    Job.id.in_(current), Job.status == JobStatus.RUNNING.value
                )
            )
        }
        if current
        else {}
    )
    taken: set[str] = set()
    for w in waiting:
        queue = queue_name(w.hardware, w.framework, w.devices)
        serving = [worker for worker in workers if queue in worker.queues]
        if any(worker.current_job_id not in running for worker in serving):
            continue  # a free worker of its queue will take it
        candidates = sorted(
            (
                running[worker.current_job_id]
                for worker in serving
                if running[worker.current_job_id].priority < w.priority
            ),
            key=lambda r: (r.priority, -(aware(r.started_at).timestamp() if r.started_at else 0.0), r.id),
        )
        victim = next((r for r in candidates if r.id not in taken), None)
        if victim is None:
            continue
        if victim.id == job.id:
            return str(w.id)
        taken.add(victim.id)
    return None
