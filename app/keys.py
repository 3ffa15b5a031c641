"""API keys: created with a random secret shown once, stored as its sha256."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from app.models import ApiKey, utcnow

KEY_PREFIX = "th_"


def hash_key(secret: str) -> str:
    # The secret has 256 bits of entropy, so a plain sha256 is enough (no password stretching).
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(
    session: Session,
    name: str,
    admin: bool = False,
    max_priority: str | None = None,
    scrape_only: bool = False,
    allow_code: bool = False,
) -> tuple[ApiKey, str]:
    """Store a new key named `name`; return its row and the secret (the only time it is seen).
    An `admin` key sees every job and worker; a user key only its own jobs; a `scrape_only` key
    reads the service-wide /metrics and nothing else. `max_priority` caps the priority of the
    key's jobs (None: any). An `allow_code` key may upload and train its own model code (where
    the deployment allows user code)."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(
        name=name,
        prefix=secret[:10],
        key_hash=hash_key(secret),
        is_admin=admin,
        max_priority=max_priority,
        scrape_only=scrape_only,
        allow_code=allow_code,
    )
    session.add(key)
    session.commit()
    return key, secret


@dataclass(frozen=True)
class Caller:
    """The live API key a request came with: what the routes need of it (its row stays in
    `api_keys`). `id` is the key's id (jobs' owner_id); an admin key sees every job and worker."""

    id: str
    is_admin: bool
    # The highest job priority the key may ask for (trainhub keys create/cap --max-priority);
    # None: any.
    max_priority: str | None = None
    # A scrape key reads the service-wide GET /metrics and nothing else (keys create --scrape).
    scrape_only: bool = False
    # May upload and train its own model code (keys create --allow-code, keys code).
    allow_code: bool = False


# Built once: every request with a key runs it. Columns, not an ApiKey entity: a third of the cost.
_keys = ApiKey.__table__.c
_LIVE_BY_HASH = select(
    _keys.id, _keys.is_admin, _keys.key_hash, _keys.max_priority, _keys.scrape_only, _keys.allow_code
).where(_keys.key_hash == bindparam("digest"), _keys.revoked_at.is_(None))


def find_key(session: Session, secret: str) -> Caller | None:
    """The live key whose secret is `secret`, or None (unknown, malformed or revoked).

    Looked up by the sha256 of the secret (an index hit reveals nothing about the secret) and
    compared in constant time; read on every request, so a revoked key is refused at once."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200 or not secret.isascii():
        return None
    digest = hash_key(secret)
    row = session.execute(_LIVE_BY_HASH, {"digest": digest}).first()
    if row is None or not hmac.compare_digest(row.key_hash, digest):
        return None
    return Caller(
        id=row.id,
        is_admin=row.is_admin,
        max_priority=row.max_priority,
        scrape_only=row.scrape_only,
        allow_code=row.allow_code,
    )


class AmbiguousKey(Exception):
    """A prefix that names more than one key."""


def list_keys(session: Session) -> list[ApiKey]:
    """Every key, oldest first (revoked ones too); rows carry the hash, never the secret."""
    return list(session.scalars(select(ApiKey).order_by(ApiKey.created_at, ApiKey.id)))


SHORT_ID = 8  # `keys list` shows a key's id by its first 8 characters, as for jobs


def find_by_ident(session: Session, ident: str) -> ApiKey | None:
    """The key whose id, first characters of its id (at least SHORT_ID) or prefix (as `keys list`
    shows them, with or without the ellipsis after the prefix) is `ident`; None when none matches.
    Raises AmbiguousKey when `ident` names several keys."""
    ident = ident.strip().removesuffix("…").removesuffix("...")
    named = (ApiKey.id == ident) | (ApiKey.prefix == ident)
    if len(ident) >= SHORT_ID:
        named |= ApiKey.id.startswith(ident.lower(), autoescape=True)  # ids are stored lower-case
    matches = list(session.scalars(select(ApiKey).where(named)))
    if len(matches) > 1:
        raise AmbiguousKey(ident)
    return matches[0] if matches else None


def cap_key(session: Session, ident: str, max_priority: str | None) -> ApiKey | None:
    """Cap the priority of the jobs of the key `ident` names (find_by_ident) at `max_priority`
    (None: no cap), from its next request on; None when no key matches."""
    key = find_by_ident(session, ident)
    if key is not None:
        key.max_priority = max_priority
        session.commit()
    return key


def allow_code(session: Session, ident: str, allowed: bool) -> ApiKey | None:
    """Grant (`allowed`) or take back the key `ident` names (find_by_ident) the right to upload and
    train its own model code, from its next request on; None when no key matches. Jobs already
    queued keep running."""
    key = find_by_ident(session, ident)
    if key is not None:
        key.allow_code = allowed
        session.commit()
    return key


def revoke_key(session: Session, ident: str) -> ApiKey | None:
    """Revoke the key whose id or prefix (as `keys list` shows them) is `ident`; None when none
    matches. Revoking a revoked key keeps its first revocation time. Raises AmbiguousKey when a
    prefix names several keys."""
    key = find_by_ident(session, ident)
    if key is None:
        return None
    if key.revoked_at is None:
        key.revoked_at = utcnow()
        session.commit()
    return key
