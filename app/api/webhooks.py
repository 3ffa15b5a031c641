"""Routes of webhooks: a key's signing secret and default URL, and a job's deliveries."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status

from app.api import json_response
from app.api.jobs import owned_job
from app.deps import CurrentUser, SessionDep
from app.errors import responses
from app.models import ApiKey
from app.webhooks import outbox, registration, urls
from app.webhooks.schemas import DeliveryPage, WebhookSecret, WebhookSecretInfo, WebhookSettings, WebhookUrl

router = APIRouter(tags=["webhooks"], responses=responses(401, 413, 503))

PREFIX_CHARS = 12


def _settings(key: ApiKey) -> WebhookSettings:
    secret = None
    if key.webhook_secret is not None and key.webhook_secret_created_at is not None:
        secret = WebhookSecretInfo(prefix=key.webhook_secret[:PREFIX_CHARS], created_at=key.webhook_secret_created_at)
    return WebhookSettings(url=key.webhook_url, secret=secret)


@router.get("/webhooks", response_model=WebhookSettings)
def read_webhooks(session: SessionDep, user: CurrentUser) -> Response:
    """The key's default webhook URL and whether it has a signing secret (its prefix, never the secret)."""
    return json_response(_settings(registration.key_row(session, user)))


@router.post("/webhooks/secret", status_code=status.HTTP_201_CREATED, response_model=WebhookSecret)
def rotate_secret(session: SessionDep, user: CurrentUser) -> Response:
    """Make the key's signing secret, shown in this answer only; any earlier one stops signing at
    once (a delivery's next attempt is signed with the new one). Every delivery carries
    `Trainhub-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, "<t>." + body)>`."""
    secret, created_at = registration.rotate_secret(session, user)
    return json_response(
        WebhookSecret(secret=secret, prefix=secret[:PREFIX_CHARS], created_at=created_at), status.HTTP_201_CREATED
    )


@router.post("/webhooks/url", response_model=WebhookSettings)
def set_url(body: WebhookUrl, session: SessionDep, user: CurrentUser) -> Response:
    """Set the key's default webhook: the status changes of its jobs whose spec names no
    `webhook_url` go there (from their next change on, jobs already submitted included). 422 for a
    URL this server does not send to, or a key without a signing secret."""
    try:
        key = registration.set_url(session, user, body.url)
    except urls.RefusedUrl as exc:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT, [{"type": "value_error", "loc": ["body", "url"], "msg": str(exc)}]
        ) from None
    except registration.NoSecret:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            [{"type": "value_error", "loc": ["body", "url"], "msg": registration.NO_SECRET}],
        ) from None
    return json_response(_settings(key))


@router.delete("/webhooks/url", response_model=WebhookSettings)
def clear_url(session: SessionDep, user: CurrentUser) -> Response:
    """Clear the key's default webhook (jobs whose spec names one keep theirs)."""
    return json_response(_settings(registration.set_url(session, user, None)))


@router.get("/jobs/{job_id}/deliveries", response_model=DeliveryPage, responses=responses(404))
def list_deliveries(
    job_id: str,
    session: SessionDep,
    user: CurrentUser,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: Annotated[str | None, Query(max_length=20)] = None,
) -> Response:
    """The job's webhook deliveries, newest first: one per status change while it had a webhook,
    with its attempts, the last answer's status or error, and when it is tried next."""
    job = owned_job(session, user, job_id)
    try:
        items, next_cursor = outbox.page(session, job.id, limit, cursor)
    except ValueError as exc:
        raise HTTPException(
            status.HTTP_422_UNPROCESSABLE_CONTENT,
            [{"loc": ["query", "cursor"], "msg": str(exc), "type": "value_error"}],
        ) from None
    return json_response(DeliveryPage(items=[outbox.delivery(row) for row in items], next_cursor=next_cursor))
