"""Error responses: FastAPI's 422 `detail` list, made safe to encode whatever the input was."""

from __future__ import annotations

import logging
import math

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

log = logging.getLogger(__name__)


def _finite(value):
    # JSON has no NaN or Infinity, and UTF-8 no lone surrogates: echo such an input back as
    # text instead of failing with a 500.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse({"detail": _finite(jsonable_encoder(exc.errors()))}, status_code=422)


async def database_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    """The database is unreachable: 503, so clients retry; nothing was half-written (each
    request's changes commit in one transaction or not at all)."""
    log.warning("database unavailable: %s", exc)
    return JSONResponse({"detail": "the database is unavailable; retry shortly"}, status_code=503,
                        headers={"Retry-After": "5"})
