"""Error responses: FastAPI's 422 `detail` list, made safe to encode whatever the input was;
`{"detail": "..."}` for the others; and how they are documented in the OpenAPI schema."""

from __future__ import annotations

import difflib
import json
import logging
import math
from typing import Any
from urllib.parse import quote

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import Scope

from app import limits
from app.db import get_reader_sessionmaker, session_scope
from app.keys import Caller, find_key
from app.limits import QuotaExceeded, SpecOverLimit
from app.middleware import is_json

log = logging.getLogger(__name__)

# How much of a bad input a 422 echoes back: enough to recognise it, not a copy of a huge or
# deeply nested body (which would also cost a deep recursion to encode).
ECHO_DEPTH = 4
ECHO_ITEMS = 20
ECHO_CHARS = 200


class Message(BaseModel):
    """An error other than a bad body: what went wrong and, where there is one, what to do."""

    detail: str


_DESCRIPTIONS = {
    400: "The request body is malformed (e.g. a multipart body without exactly one file part).",
    401: "No API key, or one that is malformed, unknown or revoked.",
    403: "The key may not do this here (e.g. user code, off unless the deployment and the key allow it).",
    404: "No such resource visible to this key (another key's resource is 404 too, never 403).",
    409: "The request conflicts with the resource's state.",
    413: "The request body is larger than this server's limit (TRAINHUB_MAX_BODY_BYTES; uploads: "
    "TRAINHUB_MAX_DATASET_BYTES), or unpacks or stores past one.",
    429: "A per-key limit is reached (queued jobs, or jobs per minute: then Retry-After says when to retry).",
    503: "The database (or artifact store) is unavailable; retry shortly.",
}


def responses(*codes: int) -> dict:
    """OpenAPI `responses` for the given error statuses, all `{"detail": "..."}`."""
    return {code: {"model": Message, "description": _DESCRIPTIONS[code]} for code in codes}


def _finite(value: Any) -> Any:
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


def _bounded(value: Any, depth: int = 0) -> Any:
    """`value` cut to ECHO_DEPTH levels, ECHO_ITEMS items and ECHO_CHARS characters a string."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int) and abs(value) > 2**63:
        text = str(value) if value.bit_length() < 4000 else "a very long number"
        return text if len(text) <= 40 else text[:40] + "…"
    if isinstance(value, str):
        return value if len(value) <= ECHO_CHARS else value[:ECHO_CHARS] + "…"
    if isinstance(value, (bytes, bytearray)):
        return _bounded(bytes(value[: ECHO_CHARS + 1]).decode("utf-8", "backslashreplace"), depth)
    if isinstance(value, dict):
        if depth >= ECHO_DEPTH:
            return "{…}"
        return {str(_bounded(k, ECHO_DEPTH)): _bounded(v, depth + 1) for k, v in list(value.items())[:ECHO_ITEMS]}
    if isinstance(value, (list, tuple)):
        if depth >= ECHO_DEPTH:
            return "[…]"
        return [_bounded(v, depth + 1) for v in list(value)[:ECHO_ITEMS]]
    return value


def _echo(error: dict) -> dict:
    # Bound what an error carries before jsonable_encoder walks it (it recurses without limit),
    # and drop the "Value error, " pydantic puts before our validators' own sentences.
    echoed = {k: (_bounded(v) if k in ("input", "ctx") else v) for k, v in error.items()}
    if isinstance(echoed.get("msg"), str):
        echoed["msg"] = echoed["msg"].removeprefix("Value error, ")
    return echoed


def _about_the_whole_body(error: dict, request: Request) -> dict:
    # "Field required" or "Input should be a valid dictionary" for the body as a whole: say what
    # the body must be, and what was wrong with the request's content type if that is the cause.
    if tuple(error.get("loc", ())) != ("body",) or error.get("type") == "value_error":
        return error  # a value_error at the body is a cross-field check (its message says which)
    content_type = request.headers.get("content-type")
    hint = (
        "the request has no body: send a JSON object"
        if error.get("type") == "missing"
        else ("the body must be a JSON object")
    )
    if not content_type or not is_json(content_type):
        hint += f" with Content-Type: application/json (got {(content_type or 'none')[:100]!r})"
    return {**error, "msg": f"{hint}; {error.get('msg', '')}"}


def _at_the_field_it_names(error: dict) -> dict:
    # A cross-field check of the spec (a model validator) is reported at the object it checks
    # (the body, or e.g. its "model"); its message starts with the field to change ("batch_size
    # 127 must be a multiple of devices", "model.batch_norm with devices above 1 ...", "channels
    # is for model cnn only"), so point `loc` at that field when the spec has it.
    loc = list(error.get("loc", ()))
    if not loc or loc[0] != "body" or error.get("type") != "value_error":
        return error
    words = str(error.get("msg", "")).split()
    path = words[0].split(".") if words else []
    return {**error, "loc": [*loc, *path]} if path and _spec_field(loc[1:] + path) else error


def _spec_field(path: list) -> bool:
    """Whether `path` (e.g. ["model", "batch_norm"]) names a field of a job spec."""
    model = _spec_model(path[:-1]) if path else None
    return model is not None and path[-1] in model.model_fields


def _spec_model(path: list) -> type[BaseModel] | None:
    """The part of a job spec at `path` (e.g. ["model"] -> ModelSpec, [] -> JobSpec), or None
    when `path` does not lead to an object of the spec."""
    from trainers.spec import JobSpec

    model: type[BaseModel] | None = JobSpec
    for name in path:
        field = model.model_fields.get(name) if model is not None and isinstance(name, str) else None
        if field is None:
            return None
        annotation = field.annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return model


def _with_the_fix(error: dict) -> dict:
    # An unknown field is most often a typo: name the nearest field ("epoch" -> "epochs"), or
    # list the fields there are. A string where an object belongs ("dataset": "digits") gets
    # the object it should be.
    loc, kind, given = list(error.get("loc", ())), error.get("type"), error.get("input")
    if not loc or loc[0] != "body":
        return error
    if kind == "extra_forbidden" and isinstance(loc[-1], str):
        model = _spec_model(loc[1:-1])
        if model is None:
            return error
        close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}?" if close else f"the fields here are {', '.join(model.model_fields)}"
        return {**error, "msg": f"{error.get('msg', '')}: unknown field {loc[-1][:60]!r}; {hint}"}
    if kind in ("model_type", "model_attributes_type") and isinstance(given, str) and len(loc) > 1:
        model = _spec_model(loc[1:])
        if model is not None and "name" in model.model_fields:
            example = json.dumps({"name": given[:60]})
            return {**error, "msg": f"{error.get('msg', '')}: {loc[-1]} is an object; write {example}"}
    return error


# A 422 lists at most this many errors: a body of thousands of unknown keys must not cost
# thousands of explanations (work on the event loop, and megabytes of answer).
MAX_ERRORS = 20


# The routes whose refused bodies count towards the key's per-minute rate (limits.record_rejection).
SUBMISSIONS = ("/jobs", "/comparisons", "/sweeps")


def _count_rejection(method: str, path: str, authorization: str | None, caller: Caller | None) -> None:
    """Count a refused submission against its key: `caller` (the one the route's within_rate
    dependency kept), or the key of the Authorization header (a body refused before dependencies
    run: unparseable, or refused by app/middleware.py). Raises QuotaExceeded, counting nothing,
    when the key had already used its submissions of the minute: the refusal is then a 429.
    Requests without a live key are not counted (they got no work)."""
    if method != "POST" or path.rstrip("/") not in SUBMISSIONS:
        return
    if caller is None:
        scheme, secret = get_authorization_scheme_param(authorization)
        if scheme.lower() != "bearer":
            return
        with get_reader_sessionmaker()() as session:
            caller = find_key(session, secret)
        if caller is None:
            return
    with session_scope() as session:
        limits.lock_key(session, caller)  # the key's refusals and submissions count one at a time
        limits.check_rate(session, caller)
        limits.record_rejection(session, caller.id)


async def refusal(scope: Scope, answer: JSONResponse) -> Response:
    """`answer` (a 422 of a submission's body), counted against the key (_count_rejection); or a
    429 when the key had already used its minute. A database error there lets the 422 out."""
    headers = Headers(scope=scope)
    state = scope.get("state") or {}
    caller = state.get("submitter") if isinstance(state, dict) else None
    try:
        await run_in_threadpool(_count_rejection, scope["method"], scope["path"], headers.get("authorization"), caller)
    except QuotaExceeded as exc:
        return await quota_exceeded(Request(scope), exc)
    except SQLAlchemyError:
        log.warning("could not count a refused submission against its key", exc_info=True)
    return answer


async def validation_error(request: Request, exc: RequestValidationError) -> Response:
    found = exc.errors()
    errors = [
        _about_the_whole_body(_with_the_fix(_at_the_field_it_names(_echo(e))), request) for e in found[:MAX_ERRORS]
    ]
    if len(found) > MAX_ERRORS:
        errors.append(
            {
                "type": "too_many_errors",
                "loc": ["body"],
                "msg": f"{len(found) - MAX_ERRORS} more errors left out; fix these and send the body again",
            }
        )
    return await refusal(request.scope, JSONResponse({"detail": _finite(jsonable_encoder(errors))}, status_code=422))


async def spec_over_limit(request: Request, exc: SpecOverLimit) -> Response:
    """A spec above one of this server's limits: 422, one item per limit, each naming it."""
    return await refusal(request.scope, JSONResponse({"detail": exc.errors}, status_code=422))


async def quota_exceeded(_request: Request, exc: QuotaExceeded) -> JSONResponse:
    """The key may not create more jobs now: 429, with Retry-After when waiting is enough."""
    headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
    return JSONResponse({"detail": exc.message}, status_code=429, headers=headers)


async def database_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    """The database is unreachable: 503, so clients retry; nothing was half-written (each
    request's changes commit in one transaction or not at all)."""
    log.warning("database unavailable: %s", exc)
    return JSONResponse(
        {"detail": "the database is unavailable; retry shortly"}, status_code=503, headers={"Retry-After": "5"}
    )


async def database_busy(_request: Request, exc: Exception) -> JSONResponse:
    """Every pooled connection stayed busy for db_pool_timeout_s: 503, so clients retry."""
    log.warning("no free database connection: %s", exc)
    return JSONResponse(
        {"detail": "the server is busy (no free database connection); retry shortly"},
        status_code=503,
        headers={"Retry-After": "1"},
    )


async def not_found(request: Request, exc: StarletteHTTPException) -> Response:
    """404s: a path no route serves says so and where the API's paths are listed; the routes' own
    404s (a job that does not exist) keep their message. Other HTTP errors pass unchanged."""
    if exc.status_code == 404 and exc.detail == "Not Found":
        path = quote(request.url.path[:200], safe="/")  # echoed percent-encoded: never markup
        detail = f"no such path: {request.method} {path}; the API's paths are listed at /docs (and /openapi.json)"
        return JSONResponse({"detail": detail}, status_code=404)
    return await http_exception_handler(request, exc)
