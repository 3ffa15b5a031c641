"""The outbox of webhook deliveries (table webhook_deliveries, filled by a trigger on `jobs`:
migration 0019): claiming the due ones, rendering a body once, recording each attempt, listing
a job's deliveries.

A claim is a lease, not a held lock: the due rows are picked with `FOR UPDATE SKIP LOCKED`
(PostgreSQL; several API processes never pick the same row) and their `next_attempt_at` pushed
LEASE past now, in a short transaction that commits before anything is sent. A process that dies
mid-send loses nothing: the lease runs out and any process sends it again (the receiver may then
get it twice, with the same Trainhub-Delivery id). Each attempt's outcome is recorded fenced by
its attempt number, so a slow attempt overtaken by a later one writes nothing.

A job's changes are sent in order: a delivery is due only when no earlier one of its job is
still pending."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Integer, bindparam, exists, or_, select, update
from sqlalchemy.orm import Session, aliased

from app import rendering
from app.config import Settings
from app.models import ApiKey, Artifact, Comparison, EpochMetric, Job, WebhookDelivery, aware, utcnow
from app.schemas import ArtifactInfo, EpochMetrics
from app.status import FINISHED
from app.webhooks import schemas
from app.webhooks.schemas import DeliveryStatus

log = logging.getLogger(__name__)

# A failed attempt is tried again after retry_base_s, doubling each time, but never more than
# this apart (seconds).
MAX_RETRY_DELAY_S = 3600.0
_TIMESTAMPS = ("created_at", "started_at", "finished_at")


@dataclass(frozen=True)
class Claimed:
    """A delivery leased to this process for one attempt: what to send, where, signed how."""

    id: str
    event: str
    url: str
    body: bytes
    attempt: int
    created_at: datetime
    secret: str | None  # the job's key's signing secret now (None: it has none)


def lease_s(settings: Settings) -> float:
    """How long a claimed delivery is left to its process before another may send it (seconds):
    longer than an attempt can take (name lookup, connect, send, answer)."""
    return 3 * settings.webhook_timeout_s + 30.0


def retry_delay(attempt: int, settings: Settings) -> float:
    """Seconds from the end of failed attempt number `attempt` (1, 2, ...) to the next one:
    retry_base_s doubled per attempt, at most MAX_RETRY_DELAY_S (or retry_base_s, if larger)."""
    base = settings.webhook_retry_base_s
    return min(base * 2.0 ** min(attempt - 1, 60), max(base, MAX_RETRY_DELAY_S))


_EARLIER = aliased(WebhookDelivery)
# The due deliveries, each the first pending one of its job, oldest due first. Built once: every
# API process asks each webhook_poll_s, and building it cost more than running it on an empty outbox.
_DUE = (
    select(WebhookDelivery.id)
    .where(
        WebhookDelivery.status == DeliveryStatus.PENDING,
        WebhookDelivery.next_attempt_at <= bindparam("now"),
        ~exists().where(
            _EARLIER.job_id == WebhookDelivery.job_id,
            _EARLIER.status == DeliveryStatus.PENDING,
            _EARLIER.seq < WebhookDelivery.seq,
        ),
    )
    .order_by(WebhookDelivery.next_attempt_at)
    .limit(bindparam("limit", type_=Integer))
    .with_for_update(skip_locked=True)
)


def claim(session: Session, limit: int, settings: Settings) -> list[Claimed]:
    """Lease up to `limit` due deliveries (their attempt counted now) and return them, each body
    rendered (and stored, for the retries) at its first attempt. Commits."""
    now = utcnow()
    ids = list(session.scalars(_DUE, {"now": now, "limit": limit}))
    if not ids:
        session.rollback()
        return []
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id.in_(ids))
        .values(
            attempts=WebhookDelivery.attempts + 1,
            last_attempt_at=now,
            next_attempt_at=now + timedelta(seconds=lease_s(settings)),
        )
    )
    session.commit()
    claimed = []
    for row in list(session.scalars(select(WebhookDelivery).where(WebhookDelivery.id.in_(ids)))):
        if row.body is None:
            try:
                row.body = render(session, row)
            except Exception:  # e.g. a stored job this version cannot render: retrying would not help
                log.exception("webhook delivery %s: the job could not be rendered; it is failed", row.id)
                session.rollback()
                _give_up(session, row.id, "internal error: the job could not be rendered")
                continue
            session.commit()  # the bytes every attempt sends
        secret = session.scalar(select(ApiKey.webhook_secret).where(ApiKey.id == row.job["owner_id"]))
        claimed.append(
            Claimed(row.id, row.event, row.url, row.body.encode(), row.attempts, aware(row.created_at), secret)
        )
    session.commit()
    return claimed


def _give_up(session: Session, delivery_id: str, error: str) -> None:
    session.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.id == delivery_id)
        .values(status=DeliveryStatus.FAILED, next_attempt_at=None, error=error)
    )
    session.commit()


def render(session: Session, row: WebhookDelivery) -> str:
    """The body of a delivery: a WebhookEvent with the job as GET /jobs/{id} shows it, at the
    status of the change (from the row's copy of the job's columns, the epochs it had finished
    then, its artifacts once it had ended). Rendered as for a user key: where it ran, not on which host."""
    columns = dict(row.job)
    for name in _TIMESTAMPS:
        if columns.get(name) is not None:
            columns[name] = aware(datetime.fromisoformat(columns[name]))
    job = Job(**columns, metrics=[], artifacts=[])
    out = rendering.job(session, job, rendering.public_base(), admin=False)
    if job.started_at is not None:
        metrics = session.scalars(
            select(EpochMetric)
            .where(EpochMetric.job_id == job.id, EpochMetric.epoch <= job.epoch)
            .order_by(EpochMetric.epoch)
        )
        base = rendering.public_base()
        artifacts: list[Artifact] = (
            list(session.scalars(select(Artifact).where(Artifact.job_id == job.id).order_by(Artifact.name)))
            if job.status in FINISHED
            else []
        )
        out = out.model_copy(
            update={
                "metrics": [EpochMetrics(**rendering.metric(m)) for m in metrics],
                "artifacts": [
                    ArtifactInfo(**rendering.artifact(a, f"{base}/jobs/{job.id}/artifacts/{a.name}")) for a in artifacts
                ],
            }
        )
    comparison_id = session.scalar(
        select(Comparison.id).where(or_(Comparison.jax_job_id == job.id, Comparison.pytorch_job_id == job.id))
    )
    event = schemas.WebhookEvent(
        id=row.id, event=row.event, created_at=row.created_at, comparison_id=comparison_id, job=out
    )
    return event.model_dump_json()


def record(
    session: Session,
    claimed: Claimed,
    response_status: int | None,
    error: str | None,
    settings: Settings,
) -> DeliveryStatus | None:
    """Record the outcome of `claimed`'s attempt: delivered (no `error`), or tried again after
    retry_delay, or failed once the next try would come later than retry_for_s after the status
    change. Returns the delivery's new status; None when the attempt no longer owns the row (its
    lease ran out and another attempt took it). Commits."""
    now = utcnow()
    if error is None:
        values: dict[str, object] = {"status": DeliveryStatus.DELIVERED, "delivered_at": now, "next_attempt_at": None}
    else:
        retry_at = now + timedelta(seconds=retry_delay(claimed.attempt, settings))
        if retry_at > claimed.created_at + timedelta(seconds=settings.webhook_retry_for_s):
            values = {"status": DeliveryStatus.FAILED, "next_attempt_at": None}
        else:
            values = {"status": DeliveryStatus.PENDING, "next_attempt_at": retry_at}
    moved = session.execute(
        update(WebhookDelivery)
        .where(
            WebhookDelivery.id == claimed.id,
            WebhookDelivery.attempts == claimed.attempt,
            WebhookDelivery.status == DeliveryStatus.PENDING,
        )
        .values(response_status=response_status, error=error[:500] if error else None, **values)
        .returning(WebhookDelivery.status)
    ).scalar()
    session.commit()
    return DeliveryStatus(moved) if moved else None


def page(session: Session, job_id: str, limit: int, cursor: str | None) -> tuple[list[WebhookDelivery], str | None]:
    """A job's deliveries, newest first, and the cursor of the next page (None on the last).
    Raises ValueError for a cursor this API did not hand out."""
    query = select(WebhookDelivery).where(WebhookDelivery.job_id == job_id)
    if cursor is not None:
        if not cursor.isdigit() or len(cursor) > 9:
            raise ValueError("cursor is not one this API returned; pass next_cursor unchanged")
        query = query.where(WebhookDelivery.seq < int(cursor))
    rows = list(session.scalars(query.order_by(WebhookDelivery.seq.desc()).limit(limit + 1)))
    items, more = rows[:limit], len(rows) > limit
    return items, str(items[-1].seq) if more else None


def delivery(row: WebhookDelivery) -> schemas.WebhookDelivery:
    """A delivery row as the HTTP WebhookDelivery."""
    return schemas.WebhookDelivery(
        id=row.id,
        event=row.event,
        url=row.url,
        status=DeliveryStatus(row.status),
        attempts=row.attempts,
        created_at=row.created_at,
        last_attempt_at=row.last_attempt_at,
        next_attempt_at=row.next_attempt_at if row.status == DeliveryStatus.PENDING else None,
        delivered_at=row.delivered_at,
        response_status=row.response_status,
        error=row.error,
    )
