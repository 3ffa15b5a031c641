"""FastAPI dependencies: a database session per request and the caller's API key."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from app.db import get_session, session_scope
from app.keys import find_key
from app.models import ApiKey

SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="An API key from `trainhub keys create`.")


def current_user(
    session: SessionDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    """The API key of the request; 401 when it is missing, malformed, unknown or revoked."""
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing API key: send 'Authorization: Bearer <key>' (create one with `trainhub keys create`)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    key = find_key(session, credentials.credentials)
    if key is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED, "invalid or revoked API key", headers={"WWW-Authenticate": "Bearer"}
        )
    return key


CurrentUser = Annotated[ApiKey, Depends(current_user)]


def current_user_briefly(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> ApiKey:
    """Like `current_user`, but its database session is closed before the handler runs: for
    long-lived responses (the event stream) that must not hold a connection while they wait."""
    with session_scope() as session:
        return current_user(session, credentials)


BriefUser = Annotated[ApiKey, Depends(current_user_briefly)]
