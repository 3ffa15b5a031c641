"""FastAPI dependencies: a database session per request and the caller's API key."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app import limits
from app.db import get_reader_sessionmaker, get_sessionmaker
from app.keys import Caller, find_key

READ_METHODS = ("GET", "HEAD")


async def get_session(request: Request) -> AsyncIterator[Session]:
    """FastAPI dependency: one session per request. A GET or HEAD only reads, so its session
    is in autocommit mode (see get_reader_sessionmaker); other methods get a transaction.

    Async so that FastAPI runs it on the event loop rather than in two thread-pool hops: opening a
    session does no I/O, and closing one only hands its connection back (with a ROLLBACK when a
    transaction was left open)."""
    make = get_reader_sessionmaker() if request.method in READ_METHODS else get_sessionmaker()
    with make() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="An API key from `trainhub keys create`.")


def current_user(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Caller:
    """The API key of the request; 401 when it is missing, malformed, unknown or revoked.

    Read in a session of its own (autocommit: one statement), closed before the route runs: a
    request holds no pooled connection while it waits for a thread for its route (were it to,
    requests holding every connection could wait on threads that wait for a connection), nor
    for the whole of a long-lived response such as the event stream."""
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            _missing_key_message(request.headers.get("authorization")),
            headers={"WWW-Authenticate": "Bearer"},
        )
    with get_reader_sessionmaker()() as session:
        key = find_key(session, credentials.credentials)
    if key is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"}
        )
    if key.scrape_only and request.url.path != SCRAPE_PATH:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            f"this is a scrape key: it reads {SCRAPE_PATH} and nothing else; use a user key for this request",
        )
    return key


# The one route a scrape-only key may call.
SCRAPE_PATH = "/metrics"


def _missing_key_message(authorization: str | None) -> str:
    """Why no API key was read, and the fix: no header, a key without `Bearer `, or another scheme.
    Nothing of the header is echoed but a scheme name (never part of a secret)."""
    fix = "send 'Authorization: Bearer <key>' (create one with `trainhub keys create`)"
    scheme = (authorization or "").split(" ", 1)[0]
    if not authorization:
        return f"missing API key: {fix}"
    if scheme.startswith("th_"):
        return "missing API key scheme: the Authorization header holds an API key without 'Bearer ' before it; " + fix
    if scheme.isalpha() and scheme.lower() != "bearer" and len(scheme) <= 20:
        return f"missing API key: the Authorization scheme must be Bearer, not {scheme!r}; {fix}"
    return f"missing or malformed API key after 'Bearer': {fix}"


CurrentUser = Annotated[Caller, Depends(current_user)]


def within_rate(request: Request, user: CurrentUser) -> Caller:
    """The caller of a submission (POST /jobs, /comparisons), refused with 429 before its body is
    validated when the key already used its submissions of the minute (limits.check_rate). The
    caller is kept on the request, so a refusal of the body counts against it (app/errors.py)."""
    with get_reader_sessionmaker()() as session:
        limits.check_rate(session, user)
    request.state.submitter = user
    return user


# A route that creates jobs takes this in place of CurrentUser.
Submitter = Annotated[Caller, Depends(within_rate)]
