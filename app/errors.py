"""Error responses: FastAPI's 422 `detail` list, made safe to encode whatever the input was."""

from __future__ import annotations

import math

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse


def _finite(value):
    # JSON has no NaN or Infinity: echo such an input back as text instead of failing with a 500.
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


async def validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse({"detail": _finite(jsonable_encoder(exc.errors()))}, status_code=422)
