"""Signatures of webhook deliveries, as Stripe and GitHub sign theirs: a per-key secret, and

    Trainhub-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256(secret, f"{t}." + body)>

The timestamp is signed with the body, so a receiver that refuses old timestamps (verify's
`tolerance_s`) cannot be replayed a captured delivery later; each attempt signs afresh, over the
same body bytes."""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time

SECRET_PREFIX = "whsec_"
HEADER = "Trainhub-Signature"
# How old a signature's timestamp a receiver accepts by default (seconds), both ways (clock skew).
TOLERANCE_S = 300


class BadSignature(ValueError):
    """The signature header is missing, malformed, too old, or does not match the body."""


def new_secret() -> str:
    """A new signing secret: `whsec_` and 256 random bits."""
    return SECRET_PREFIX + secrets.token_urlsafe(32)


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The hex HMAC-SHA256 of `f"{timestamp}." + body` under `secret`."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def header(secret: str, body: bytes, timestamp: int | None = None) -> str:
    """The Trainhub-Signature header value for `body`, signed now (or at `timestamp`, unix seconds)."""
    t = int(time.time()) if timestamp is None else timestamp
    return f"t={t},v1={signature(secret, t, body)}"


def verify(
    secret: str, value: str | None, body: bytes, tolerance_s: float = TOLERANCE_S, now: float | None = None
) -> int:
    """Check a Trainhub-Signature header `value` against `body` (the raw bytes received); the
    signed timestamp (unix seconds) when it matches. Raises BadSignature otherwise, or when the
    timestamp is more than `tolerance_s` from `now` (default: the clock)."""
    if not value:
        raise BadSignature(f"no {HEADER} header")
    parts: dict[str, list[str]] = {}
    for item in value.split(","):
        name, _, content = item.strip().partition("=")
        parts.setdefault(name, []).append(content)
    try:
        timestamp = int(parts["t"][0])
    except (KeyError, ValueError):
        raise BadSignature(f"{HEADER} has no t=<unix seconds>") from None
    if abs((time.time() if now is None else now) - timestamp) > tolerance_s:
        raise BadSignature(f"{HEADER} timestamp is more than {tolerance_s:g} s away")
    expected = signature(secret, timestamp, body)
    if not any(hmac.compare_digest(expected, given) for given in parts.get("v1", [])):
        raise BadSignature(f"{HEADER} does not match the body")
    return timestamp
