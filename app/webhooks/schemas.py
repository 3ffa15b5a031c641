"""HTTP schemas of webhooks: what a receiver is sent, a key's settings, and a job's deliveries."""

from __future__ import annotations

from enum import StrEnum, auto
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from app.schemas import Job, Timestamp
from trainers.spec import MAX_WEBHOOK_URL_CHARS


class DeliveryStatus(StrEnum):
    """A delivery's state (spelled by auto(): the job statuses keep their one home, app/status.py)."""

    PENDING = auto()
    DELIVERED = auto()
    FAILED = auto()


class WebhookEvent(BaseModel):
    """The body POSTed to a webhook: one status change of one job. A retry sends the same bytes;
    `id` is the delivery's (the Trainhub-Delivery header), the same for every attempt, so a
    receiver that got it before can ignore it."""

    id: str
    event: str = Field(description="job.<status>: job.queued, job.running, job.succeeded, job.failed, ...")
    created_at: Timestamp = Field(description="When the job's status changed.")
    comparison_id: str | None = Field(None, description="The comparison the job is one side of, if any.")
    job: Job = Field(description="The job at that status, as GET /jobs/{id} showed it.")


class WebhookDelivery(BaseModel):
    """One status change of a job sent (or being sent) to its webhook, and how its attempts went."""

    id: str
    event: str
    url: str
    status: DeliveryStatus = Field(
        description="pending (next_attempt_at says when it is tried next), delivered (a 2xx answer), or "
        "failed (no 2xx answer within TRAINHUB_WEBHOOK_RETRY_FOR_S of the status change)."
    )
    attempts: int
    created_at: Timestamp
    last_attempt_at: Timestamp | None
    next_attempt_at: Timestamp | None
    delivered_at: Timestamp | None
    response_status: int | None = Field(description="The HTTP status of the last attempt's answer (none: no answer).")
    error: str | None = Field(description="Why the last attempt failed (null once delivered).")


class DeliveryPage(BaseModel):
    """A job's deliveries, newest first; pass `next_cursor` as `cursor` for the next page."""

    items: list[WebhookDelivery]
    next_cursor: str | None


class WebhookSecretInfo(BaseModel):
    prefix: str = Field(description="The first characters of the secret, to tell which one you hold.")
    created_at: Timestamp


class WebhookSettings(BaseModel):
    """The key's webhook settings: its default URL (used by jobs whose spec names none) and
    whether it has a signing secret (never shown again after it was made)."""

    url: str | None
    secret: WebhookSecretInfo | None


class WebhookSecret(BaseModel):
    """A new signing secret: shown this once. Keep it where your receiver can read it."""

    secret: str
    prefix: str
    created_at: Timestamp


class WebhookUrl(BaseModel):
    """The key's default webhook URL."""

    model_config = ConfigDict(extra="forbid", strict=True)

    url: Annotated[str, Field(min_length=1, max_length=MAX_WEBHOOK_URL_CHARS)]
