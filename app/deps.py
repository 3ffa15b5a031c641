"""FastAPI dependencies: a database session per request and the caller's API key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.db import get_reader_sessionmaker, get_session
from app.keys import Caller, find_key

SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="An API key from `trainhub keys create`.")


def current_user(
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
            "missing API key: send 'Authorization: Bearer <key>' (create one with `trainhub keys create`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    with get_reader_sessionmaker()() as session:
        key = find_key(session, credentials.credentials)
    if key is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"}
        )
    return key


CurrentUser = Annotated[Caller, Depends(current_user)]
