"""The operator's limits on what a key may ask for (Settings, TRAINHUB_MAX_*), enforced by the API.

Two kinds, with their own status codes:

- A spec above a limit (epochs, batch size, parameters, max_runtime_s, labels) is 422, in
  FastAPI's `detail` list shape, one item per limit exceeded, its `loc` the field and its `msg`
  naming the limit and the variable that sets it. The JobSpec's hard caps (trainers/spec.py)
  stay the absolute bounds: Settings may only lower them.
- A key over its quota (jobs queued, jobs created in the last minute) is 429; the per-minute
  one says when to retry (Retry-After, seconds).

Quotas are counted in the database: it is the one store every API process shares in every
deployment (the embedded stack has no Redis). The jobs rows are the log of submissions
(created_at); the key's queued jobs are its `job_counts` tally, kept by triggers (migration
0018), so their count is a few rows however many are queued. The new rows are inserted first;
then, in the same transaction, the key is locked (a transaction-level advisory lock on
PostgreSQL), its jobs counted, the new ones included, and the transaction commits or rolls back.
The count runs after the lock is granted, so it sees every row of the key's earlier requests:
concurrent requests of one key, on any number of API processes, are counted one after another
and never both slip under the limit. On PostgreSQL the lock, the count, the verdict and the
COMMIT are one query (migration 0026), so an accepted submission holds the lock for the
database's work alone, not while an API thread waits for its process's GIL. Other keys are not
blocked. SQLite (one embedded API process) serialises writers itself.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TypeVar

from sqlalchemy import BigInteger, bindparam, cast, delete, func, insert, select, text, union_all
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session

from app import retention
from app.config import Settings, get_settings
from app.keys import Caller
from app.models import Job, JobCount, RejectedSubmission, utcnow
from app.status import JobStatus
from trainers.spec import PRIORITIES, TrainingSpec, memory_estimate, parameter_count, test_size, train_size

RATE_WINDOW_S = 60.0
SpecT = TypeVar("SpecT", bound=TrainingSpec)


@dataclass
class SpecOverLimit(Exception):
    """The spec asks for more than this server allows: FastAPI-style 422 `detail` items."""

    errors: list[dict]


@dataclass
class QuotaExceeded(Exception):
    """The key may not create more jobs now; `retry_after_s` when waiting helps."""

    message: str
    retry_after_s: int | None = None


def _loc(field: str | list[str]) -> list[str]:
    return ["body", *(field.split(".") if isinstance(field, str) else field)]


def _limit(field: str | list[str], message: str, setting: str, value: object) -> dict:
    return {
        "type": "limit_exceeded",
        "loc": _loc(field),
        "msg": f"{message} (limit {setting} = {value:,}, set by TRAINHUB_{setting.upper()})",
        "ctx": {"limit": setting, "value": value},
    }


def _plain(field: str | list[str], message: str) -> dict:
    return {"type": "value_error", "loc": _loc(field), "msg": message}


# Bidirectional embeddings, overrides and isolates: they make "evil\u202etxt.exe" read as
# "evilexe.txt". (Other format characters are refused too, but for the zero-width joiner of emoji.)
BIDI_CONTROLS = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
ZERO_WIDTH_JOINER = "\u200d"
# Letters and symbols that render as nothing: Hangul fillers, the blank Braille pattern.
FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _has_control(text: str) -> bool:
    # Names and labels end up in terminals, logs and pages: no control characters (ANSI escapes,
    # NUL, newlines), lone surrogates, bidi controls or other invisible format characters
    # (zero-width spaces, RLM/ALM, word joiners, BOMs, tag characters); other Unicode is welcome.
    return any(
        unicodedata.category(ch) in ("Cc", "Cs", "Zl", "Zp")
        or ch in BIDI_CONTROLS
        or (unicodedata.category(ch) == "Cf" and ch != ZERO_WIDTH_JOINER)
        for ch in text
    )


def _is_visible(text: str) -> bool:
    """Whether `text` shows something: a character that is not a space, separator, control,
    format or combining mark, nor a filler that renders as nothing."""
    return any(
        unicodedata.category(ch)[0] not in "ZC" and unicodedata.category(ch) not in ("Mn", "Me") and ch not in FILLERS
        for ch in text
    )


def _gib(size: int) -> str:
    return f"{size / 1024**3:.2f} GiB"


def check_spec(spec: TrainingSpec, settings: Settings | None = None, caller: Caller | None = None) -> None:
    """Raise SpecOverLimit listing every limit of `settings` (and of the `caller`'s key: its
    priority cap) the spec exceeds."""
    s = settings or get_settings()
    errors = []
    if spec.epochs > s.max_epochs:
        errors.append(
            _limit("epochs", f"epochs {spec.epochs} is more than this server allows", "max_epochs", s.max_epochs)
        )
    if spec.batch_size > s.max_batch_size:
        errors.append(
            _limit(
                "batch_size",
                f"batch_size {spec.batch_size} is more than this server allows",
                "max_batch_size",
                s.max_batch_size,
            )
        )
    # User code: its parameters and memory are known only once built (the child's RLIMIT_AS caps it).
    if not spec.model.user_code and (count := parameter_count(spec)) > s.max_parameters:
        errors.append(
            _limit(
                "model.hidden_sizes",
                f"model.hidden_sizes gives {count:,} parameters, more than "
                "this server allows; use fewer or smaller hidden layers",
                "max_parameters",
                s.max_parameters,
            )
        )
    for split, examples in (("train_limit", train_size(spec.dataset)), ("test_limit", test_size(spec.dataset))):
        if examples > s.max_examples:
            errors.append(
                _limit(
                    f"dataset.{split}",
                    f"dataset.{split} gives {examples:,} examples, more than this server allows",
                    "max_examples",
                    s.max_examples,
                )
            )
    memory = {"total": 0} if spec.model.user_code else memory_estimate(spec)
    if memory["total"] > s.max_job_memory_bytes:
        parts = ", ".join(f"{name} {_gib(size)}" for name, size in memory.items() if name != "total")
        errors.append(
            _limit(
                "batch_size",
                f"the job would need about {_gib(memory['total'])} of memory ({parts}), more than this server "
                "allows; use fewer examples (dataset.train_limit), a smaller batch_size or a smaller model",
                "max_job_memory_bytes",
                s.max_job_memory_bytes,
            )
        )
    if spec.max_runtime_s is not None and spec.max_runtime_s > s.max_runtime_s:
        errors.append(
            _limit(
                "max_runtime_s",
                f"max_runtime_s {spec.max_runtime_s:g} s is more than this server allows",
                "max_runtime_s",
                s.max_runtime_s,
            )
        )
    if len(spec.labels) > s.max_labels:
        errors.append(
            _limit("labels", f"{len(spec.labels)} labels are more than this server allows", "max_labels", s.max_labels)
        )
    for key, value in spec.labels.items():
        if len(key) > s.max_label_key_chars:
            errors.append(
                _limit(
                    ["labels", key[:64]],
                    f"label key of {len(key)} characters is longer than this server allows",
                    "max_label_key_chars",
                    s.max_label_key_chars,
                )
            )
        if len(value) > s.max_label_value_chars:
            errors.append(
                _limit(
                    ["labels", key[:64]],
                    f"label value of {len(value)} characters is longer than this server allows",
                    "max_label_value_chars",
                    s.max_label_value_chars,
                )
            )
        if not _is_visible(key) or _has_control(key) or _has_control(value):
            errors.append(
                _plain(
                    ["labels", key[:64]],
                    "label keys must show something visible, and keys and values may not contain control or "
                    "invisible format characters (newlines, escapes, zero-width or bidi characters)",
                )
            )
    if spec.name is not None and (_has_control(spec.name) or not _is_visible(spec.name)):
        errors.append(
            _plain(
                "name",
                "name must show something visible and may not contain control or invisible "
                "format characters (newlines, NUL, escapes, zero-width or bidi characters)",
            )
        )
    if caller is not None and (error := _over_priority_cap(spec, caller)):
        errors.append(error)
    errors.extend(retention.spec_errors(spec, s))
    if errors:
        raise SpecOverLimit(errors)


def capped_priority(spec: SpecT, caller: Caller) -> SpecT:
    """`spec` with the key's priority cap as its priority when it names none and the cap is
    below the default (normal): a key capped at low submits at low without saying so."""
    cap = caller.max_priority
    if cap is None or "priority" in spec.model_fields_set or PRIORITIES.index(cap) >= PRIORITIES.index(spec.priority):
        return spec
    return spec.model_copy(update={"priority": cap})


def _over_priority_cap(spec: TrainingSpec, caller: Caller) -> dict | None:
    cap = caller.max_priority
    if cap is None or PRIORITIES.index(spec.priority) <= PRIORITIES.index(cap):
        return None
    return {
        "type": "limit_exceeded",
        "loc": ["body", "priority"],
        "msg": f"priority {spec.priority} is above this key's cap of {cap} (set by an admin with "
        f"`trainhub keys cap`): use priority {cap} or lower",
        "ctx": {"limit": "max_priority", "value": cap},
    }


def apply_limits(spec: TrainingSpec, settings: Settings | None = None, caller: Caller | None = None) -> TrainingSpec:
    """The spec, checked (SpecOverLimit; with `caller`, against its key's priority cap too) and
    with max_runtime_s set to the server's limit when it names none: every job has a deadline,
    and its spec says which."""
    s = settings or get_settings()
    check_spec(spec, s, caller)
    if spec.max_runtime_s is None:
        spec = spec.model_copy(update={"max_runtime_s": float(s.max_runtime_s)})
    return spec


# Built once: every POST /jobs runs them, and building a statement costs more than running it.
_RECENT = Job.created_at > bindparam("since")
# PostgreSQL: an advisory lock named after the key (migration 0024), not a lock on its row, which
# each INSERT of a job share-locks (the foreign key check).
_ADVISORY_LOCK_KEY = text("SELECT trainhub_lock_key(:owner_id)")
# SQLite has one writer at a time: a write that changes nothing takes that lock until the commit.
_SQLITE_WRITE_LOCK = text("UPDATE api_keys SET id = id WHERE id = :owner_id")
# PostgreSQL: the key's lock, its counts and the COMMIT, sent as one query (migration 0026): the
# lock is held for the database's work alone, never while this process waits for its GIL.
# `trainhub_check_quota` raises QUOTA_SQLSTATE, with the counts as its detail, when over a limit.
_CHECK_QUOTA_AND_COMMIT = "SELECT FROM trainhub_check_quota({}, {}, {}, {}, {}); COMMIT"
QUOTA_SQLSTATE = "TH429"
_REJECTED = RejectedSubmission.__table__.c
_REJECTED_RECENT = (_REJECTED.owner_id == bindparam("owner_id"), _REJECTED.at > bindparam("since"))
# The key's queued jobs from its tally rows (a few, whatever the jobs stored): on SQLite the
# triggers run at each change, so the count includes the transaction's own flushed jobs.
_QUEUED_TALLY = select(cast(func.coalesce(func.sum(JobCount.n), 0), BigInteger)).where(
    JobCount.owner_id == bindparam("owner_id"), JobCount.status == JobStatus.QUEUED.value
)
# The key's submissions in the window, created jobs and refused ones: each set from its own index,
# bounded by the rate limit, not by the jobs the key ever had.
_COUNT_RECENT = select(func.count() + select(func.count()).where(*_REJECTED_RECENT).scalar_subquery()).where(
    Job.owner_id == bindparam("owner_id"), _RECENT
)
# The key's submissions in the window, created jobs and refused ones alike, oldest first.
_WINDOW = union_all(
    select(Job.created_at.label("at")).where(Job.owner_id == bindparam("owner_id"), _RECENT),
    select(_REJECTED.at.label("at")).where(*_REJECTED_RECENT),
).subquery()
_RECENT_OLDEST_FIRST = select(_WINDOW.c.at).order_by(_WINDOW.c.at)
_FORGET_REJECTED = delete(RejectedSubmission).where(
    RejectedSubmission.owner_id == bindparam("owner_id"), RejectedSubmission.at <= bindparam("since")
)
_RECORD_REJECTED = insert(RejectedSubmission).values(owner_id=bindparam("owner_id"), at=bindparam("now"))


def lock_key(session: Session, owner: Caller) -> None:
    """Lock the key for the rest of the transaction: what it counts (jobs, stored datasets) is
    counted by one request of the key at a time. On SQLite this takes the database's one write
    lock (a write that changes nothing), so call it before the transaction's reads."""
    if session.get_bind().dialect.name == "postgresql":
        session.execute(_ADVISORY_LOCK_KEY, {"owner_id": owner.id})
    else:
        session.execute(_SQLITE_WRITE_LOCK, {"owner_id": owner.id})


def commit_within_quota(session: Session, owner: Caller, new_jobs: int = 1, settings: Settings | None = None) -> None:
    """Commit the transaction that adds the key's `new_jobs` jobs (flushed), or, when they would
    pass the key's queued or per-minute limit, roll it back (the new rows with it) and raise
    QuotaExceeded. The key is locked for the count, so its submissions count one at a time.

    On PostgreSQL the lock, the count and the COMMIT are one round trip (migration 0026); the
    session's commit that follows has nothing left to send."""
    s = settings or get_settings()
    now = utcnow()
    since = now - timedelta(seconds=RATE_WINDOW_S)
    session.flush()  # whatever the transaction adds is committed under the lock, counted
    if session.get_bind().dialect.name == "postgresql":
        counts = _commit_or_counts(session, owner, new_jobs, since, s)
    else:  # SQLite: the flushed INSERT holds the one write lock, and its tally triggers ran
        params = {"owner_id": owner.id, "since": since}
        queued = max(0, session.execute(_QUEUED_TALLY, params).scalar_one() - new_jobs)
        recent = session.execute(_COUNT_RECENT, params).scalar_one() - new_jobs
        counts = None if _within(queued, recent, new_jobs, s) else (queued, recent)
    if counts is None:
        session.commit()
        return
    session.rollback()
    raise _over_quota(session, owner, *counts, new_jobs, since, now, s)


def _commit_or_counts(
    session: Session, owner: Caller, new_jobs: int, since: datetime, s: Settings
) -> tuple[int, int] | None:
    """PostgreSQL: check and commit in one query; None when committed, else the key's queued
    jobs and recent submissions (before these) that refused them."""
    connection = session.connection()
    values = (owner.id, since, new_jobs, s.max_queued_jobs_per_key, s.max_submissions_per_minute)
    import psycopg  # here: the embedded stack (SQLite) runs without it
    from psycopg import sql as psycopg_sql

    query = psycopg_sql.SQL(_CHECK_QUOTA_AND_COMMIT).format(*map(psycopg_sql.Literal, values))
    try:
        # no_parameters: the query goes as it is, with no placeholder parsing of its literals
        connection.execution_options(no_parameters=True).exec_driver_sql(
            query.as_string(connection.connection.driver_connection)
        ).close()
    except DBAPIError as error:
        refusal = error.orig
        if not isinstance(refusal, psycopg.Error) or refusal.sqlstate != QUOTA_SQLSTATE:
            raise
        queued, recent = (refusal.diag.message_detail or "").split()
        return int(queued), int(recent)
    return None


def _within(queued: int, recent: int, new_jobs: int, s: Settings) -> bool:
    """Whether `new_jobs` more fit the key's limits, given its `queued` and `recent` ones (the
    rule trainhub_check_quota applies on PostgreSQL)."""
    return queued + new_jobs <= s.max_queued_jobs_per_key and recent + new_jobs <= s.max_submissions_per_minute


def queued_room(session: Session, owner: Caller, settings: Settings | None = None) -> int:
    """How many more jobs the key may queue now (max_queued_jobs_per_key less its queued jobs):
    a sweep starts at most that many trials at a turn, and waits for room for the rest. Exact
    only under lock_key, held until the new jobs are committed."""
    s = settings or get_settings()
    queued = max(0, session.execute(_QUEUED_TALLY, {"owner_id": owner.id}).scalar_one())  # a lost tally: no credit
    return max(0, s.max_queued_jobs_per_key - queued)


def check_rate(session: Session, owner: Caller, settings: Settings | None = None) -> None:
    """QuotaExceeded (with Retry-After) when the key already used its submissions of the minute,
    created or refused: asked before a submission's body is validated, so a key sending invalid
    bodies is answered 429 without the work of explaining them. Counts only; locks nothing (the
    exact count is commit_within_quota's, under the key's lock)."""
    s = settings or get_settings()
    now = utcnow()
    since = now - timedelta(seconds=RATE_WINDOW_S)
    params = {"owner_id": owner.id, "since": since}
    recent = session.execute(_COUNT_RECENT, params).scalar_one()
    if recent >= s.max_submissions_per_minute:
        retry_after = seconds_until_freed(session, owner, since, now, recent - s.max_submissions_per_minute + 1)
        raise QuotaExceeded(
            f"this key sent {recent} submission(s) in the last minute, created or refused as invalid; the limit "
            f"is {s.max_submissions_per_minute} per minute (max_submissions_per_minute, set by "
            f"TRAINHUB_MAX_SUBMISSIONS_PER_MINUTE): retry in {retry_after} s",
            retry_after,
        )


def record_rejection(session: Session, owner_id: str) -> None:
    """Count one refused submission of the key towards its per-minute rate, forgetting its
    refusals older than the window (so the table holds at most a minute of them). Commits."""
    now = utcnow()
    session.execute(_FORGET_REJECTED, {"owner_id": owner_id, "since": now - timedelta(seconds=RATE_WINDOW_S)})
    session.execute(_RECORD_REJECTED, {"owner_id": owner_id, "now": now})
    session.commit()


def _over_quota(
    session: Session,
    owner: Caller,
    queued: int,
    recent: int,
    new_jobs: int,
    since: datetime,
    now: datetime,
    s: Settings,
) -> QuotaExceeded:
    """Why `new_jobs` more jobs do not fit, given the key's `queued` and `recent` ones."""
    if queued + new_jobs > s.max_queued_jobs_per_key:
        return QuotaExceeded(
            f"this key has {queued} job(s) queued{_and_this(new_jobs)}; the limit is {s.max_queued_jobs_per_key} "
            f"(max_queued_jobs_per_key, set by TRAINHUB_MAX_QUEUED_JOBS_PER_KEY): wait for some to start "
            "or cancel some"
        )
    if new_jobs > s.max_submissions_per_minute:
        return QuotaExceeded(
            f"this request creates {new_jobs} jobs, more than the limit of {s.max_submissions_per_minute} per minute "
            "(max_submissions_per_minute, set by TRAINHUB_MAX_SUBMISSIONS_PER_MINUTE)"
        )
    excess = recent + new_jobs - s.max_submissions_per_minute
    retry_after = seconds_until_freed(session, owner, since, now, excess)
    return QuotaExceeded(
        f"this key sent {recent} submission(s) in the last minute{_and_this(new_jobs)}; the limit is "
        f"{s.max_submissions_per_minute} per minute (max_submissions_per_minute, set by "
        f"TRAINHUB_MAX_SUBMISSIONS_PER_MINUTE): retry in {retry_after} s",
        retry_after,
    )


def _and_this(new_jobs: int) -> str:
    return f" and this request creates {new_jobs} more" if new_jobs > 1 else ""


def seconds_until_freed(session: Session, owner: Caller, since: datetime, now: datetime, excess: int) -> int:
    """Seconds until the key's window (its submissions after `since`, created jobs and refused
    ones) has room again: once its `excess` oldest submissions are a minute old. At least 1."""
    oldest = session.scalar(_RECENT_OLDEST_FIRST.offset(excess - 1).limit(1), {"owner_id": owner.id, "since": since})
    if oldest is None:  # rows deleted since they were counted
        return 1
    if oldest.tzinfo is None:  # SQLite keeps no time zone; every stored time is UTC
        oldest = oldest.replace(tzinfo=UTC)
    return max(1, math.ceil((oldest + timedelta(seconds=RATE_WINDOW_S) - now).total_seconds()))
