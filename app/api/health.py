"""Liveness and readiness."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import text

from app.db import get_engine
from app.queue import get_celery

router = APIRouter(tags=["health"])


class Readiness(BaseModel):
    """`checks`: "ok" or "unreachable: <error type>" for the database and the broker."""

    status: Literal["ready", "unavailable"]
    checks: dict[str, str]


@router.get("/healthz")
def healthz() -> dict:
    """The process answers."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    response_model=Readiness,
    responses={503: {"model": Readiness, "description": "The database or the broker is unreachable."}},
)
def readyz() -> JSONResponse:
    """200 when the database and the broker are reachable, 503 naming what is not."""
    checks = {"database": _check_database(), "broker": _check_broker()}
    ready = all(v == "ok" for v in checks.values())
    return JSONResponse({"status": "ready" if ready else "unavailable", "checks": checks}, 200 if ready else 503)


def _check_database() -> str:
    try:
        with get_engine().connect() as connection:
            connection.execute(text("SELECT 1"))
        return "ok"
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}"


def _check_broker() -> str:
    try:
        with get_celery().connection_for_write() as connection:
            connection.ensure_connection(max_retries=1, timeout=2)
        return "ok"
    except Exception as exc:
        return f"unreachable: {type(exc).__name__}"
