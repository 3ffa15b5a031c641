"""API keys: created with a random secret shown once, stored as its sha256."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import ApiKey

KEY_PREFIX = "th_"


def hash_key(secret: str) -> str:
    # The secret has 256 bits of entropy, so a plain sha256 is enough (no password stretching).
    return hashlib.sha256(secret.encode()).hexdigest()


def create_key(session: Session, name: str) -> tuple[ApiKey, str]:
    """Store a new key named `name`; return its row and the secret (the only time it is seen)."""
    secret = KEY_PREFIX + secrets.token_urlsafe(32)
    key = ApiKey(name=name, prefix=secret[:10], key_hash=hash_key(secret))
    session.add(key)
    session.commit()
    return key, secret


def find_key(session: Session, secret: str) -> ApiKey | None:
    """The live key whose secret is `secret`, or None (unknown, malformed or revoked)."""
    if not secret.startswith(KEY_PREFIX) or len(secret) > 200:
        return None
    digest = hash_key(secret)
    key = session.scalars(select(ApiKey).where(ApiKey.key_hash == digest)).first()
    if key is None or key.revoked_at is not None or not hmac.compare_digest(key.key_hash, digest):
        return None
    return key
