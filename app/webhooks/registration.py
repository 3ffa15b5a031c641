"""A key's webhook settings: its signing secret (made or rotated, shown once), its default URL, and
the check of a spec's `webhook_url` at submission."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import update
from sqlalchemy.orm import Session

from app.config import Settings, get_settings
from app.keys import Caller
from app.limits import SpecOverLimit
from app.models import ApiKey, utcnow
from app.webhooks import signing, urls
from trainers.spec import TrainingSpec

NO_SECRET = (
    "this key has no webhook signing secret yet: create one with POST /webhooks/secret "
    "(`trainhub webhooks secret`) and keep it to verify deliveries, then try again"
)


class NoSecret(Exception):
    """The key has no signing secret, which a webhook needs (NO_SECRET says how to make one)."""


def key_row(session: Session, caller: Caller) -> ApiKey:
    """The caller's key row (it exists: the request was authenticated with it)."""
    key = session.get(ApiKey, caller.id)
    assert key is not None, caller.id
    return key


def rotate_secret(session: Session, caller: Caller) -> tuple[str, datetime]:
    """Make the key's signing secret, replacing any earlier one (from the next attempt on, every
    delivery is signed with the new one); returns it, the only time it is shown, and when it was made."""
    secret, now = signing.new_secret(), utcnow()
    session.execute(
        update(ApiKey).where(ApiKey.id == caller.id).values(webhook_secret=secret, webhook_secret_created_at=now)
    )
    session.commit()
    return secret, now


def set_url(session: Session, caller: Caller, url: str | None, settings: Settings | None = None) -> ApiKey:
    """Set (or, None, clear) the key's default webhook URL: where its jobs' status changes go when
    their spec names none. Raises urls.RefusedUrl for a URL this server does not send to, and
    NoSecret when the key has no signing secret."""
    key = key_row(session, caller)
    if url is not None:
        urls.check(url, (settings or get_settings()).webhook_allow_private)
        if key.webhook_secret is None:
            raise NoSecret()
    key.webhook_url = url
    session.commit()
    return key


def check_spec(session: Session, caller: Caller, spec: TrainingSpec, settings: Settings | None = None) -> None:
    """Raise SpecOverLimit (422, loc ["body", "webhook_url"]) when the spec's webhook_url is one
    this server does not send to (urls.check), or the key has no signing secret."""
    if spec.webhook_url is None:
        return
    try:
        urls.check(spec.webhook_url, (settings or get_settings()).webhook_allow_private)
    except urls.RefusedUrl as exc:
        raise SpecOverLimit([_error(str(exc))]) from None
    if key_row(session, caller).webhook_secret is None:
        raise SpecOverLimit([_error(NO_SECRET)])


def _error(message: str) -> dict:
    return {"type": "value_error", "loc": ["body", "webhook_url"], "msg": message}
