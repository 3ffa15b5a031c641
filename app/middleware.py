"""ASGI middleware: request body limits and security headers.

Both are plain ASGI (not BaseHTTPMiddleware), so streamed responses such as the event stream
pass through untouched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from email.message import Message
from typing import Any

from starlette.datastructures import Headers, MutableHeaders
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.types import Message as AsgiMessage

from app.config import get_settings

BODY_METHODS = ("POST", "PUT", "PATCH", "DELETE")


def json_depth(value: object) -> int:
    """Nesting depth of a parsed JSON value: 0 for a scalar, 1 for [] or {}, 2 for [[]]..."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in item)
    return deepest


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI parses a body of this content type as JSON (it does when there is none)."""
    if not content_type:
        return True
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (subtype == "json" or subtype.endswith("+json"))


class DuplicateKey(ValueError):
    """A JSON object names the same key twice."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


# No object of the API has more keys (a spec has about twenty fields, labels at most 32): a body
# of thousands of keys is refused before validation would explain each of them.
MAX_JSON_KEYS = 256


class TooManyKeys(ValueError):
    """A JSON object has more than MAX_JSON_KEYS keys."""


def refuse_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    """json.loads' object_pairs_hook: a dict, or DuplicateKey when a key comes twice (RFC 8259
    leaves that undefined; silently keeping the last would hide what the sender meant), or
    TooManyKeys beyond MAX_JSON_KEYS."""
    if len(pairs) > MAX_JSON_KEYS:
        raise TooManyKeys(len(pairs))
    seen: dict = {}
    for key, value in pairs:
        if key in seen:
            raise DuplicateKey(key)
        seen[key] = value
    return seen


def _body_error(message: str, kind: str) -> JSONResponse:
    return JSONResponse({"detail": [{"type": kind, "loc": ["body"], "msg": message}]}, status_code=422)


def is_upload(scope: Mapping[str, Any]) -> bool:
    """Whether the request is an upload (POST /datasets, POST /code), whose body is streamed to disk
    by its route under its own limit, not read here."""
    return scope["method"] == "POST" and scope["path"].rstrip("/") in ("/datasets", "/code")


class RequestLimits:
    """Refuse a body over `max_body_bytes` (413, before reading it when Content-Length says so)
    and a JSON body that cannot be parsed safely (422): nested deeper than `max_json_depth`,
    numbers of thousands of digits, or not UTF-8. Bodies within the limits are read here (they
    are small) and handed on unchanged."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS or is_upload(scope):
            # (a GET's body is never read, so it is never refused either; an upload is streamed
            # to disk by its route, under its own limit, TRAINHUB_MAX_DATASET_BYTES)
            await self.app(scope, receive, send)
            return
        settings = get_settings()
        limit = settings.max_body_bytes
        headers = Headers(scope=scope)
        too_large = JSONResponse(
            {
                "detail": f"request body larger than this server's limit of {limit:,} bytes "
                "(max_body_bytes, set by TRAINHUB_MAX_BODY_BYTES)"
            },
            status_code=413,
        )
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                await JSONResponse({"detail": "Content-Length must be a whole number of bytes"}, status_code=400)(
                    scope, receive, send
                )
                return
            if int(declared) > limit:
                await too_large(scope, receive, send)
                return

        body = bytearray()
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before sending its body: nothing to answer
            body += message.get("body", b"")
            if len(body) > limit:
                await too_large(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        if body and is_json(headers.get("content-type")):
            error = self._json_error(bytes(body), settings.max_json_depth)
            if error is not None:
                from app.errors import refusal  # (app.errors imports this module)

                # a refused submission counts against its key, and is a 429 past its minute
                await (await refusal(scope, error))(scope, receive, send)
                return

        replayed = False

        async def replay() -> AsgiMessage:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": bytes(body), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    @staticmethod
    def _json_error(body: bytes, max_depth: int) -> JSONResponse | None:
        try:
            value = json.loads(body, object_pairs_hook=refuse_duplicate_keys)
        except TooManyKeys as exc:
            return _body_error(
                f"a JSON object with {exc.args[0]} keys; no object of this API has more than {MAX_JSON_KEYS}",
                "json_too_many_keys",
            )
        except DuplicateKey as exc:
            return _body_error(
                f"the key {exc.key[:100]!r} appears twice in one JSON object; send it once", "json_duplicate_key"
            )
        except RecursionError:
            return _body_error(
                f"JSON nested deeper than this server's limit of {max_depth} levels "
                "(max_json_depth, set by TRAINHUB_MAX_JSON_DEPTH)",
                "json_too_deep",
            )
        except json.JSONDecodeError:
            return None  # FastAPI answers 422 with where the JSON breaks
        except UnicodeDecodeError:
            return _body_error("the body is not UTF-8 encoded JSON", "json_invalid")
        except ValueError as exc:  # e.g. an integer of more than 4300 digits
            return _body_error(f"the body is not usable JSON: {exc}", "json_invalid")
        if json_depth(value) > max_depth:
            return _body_error(
                f"JSON nested deeper than this server's limit of {max_depth} levels "
                "(max_json_depth, set by TRAINHUB_MAX_JSON_DEPTH)",
                "json_too_deep",
            )
        return None


# Every response gets these unless it set its own (the dashboard's pages set a CSP that lets
# them load their scripts; the API's JSON and files need nothing at all).
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
}


class SecurityHeaders:
    """Add SECURITY_HEADERS to every HTTP response (keeping any the route set itself), and
    `Cache-Control: no-store` to answers of requests that carried an API key, so no shared
    cache keeps one user's jobs or files."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        with_key = "authorization" in Headers(scope=scope)

        async def send_with_headers(message: AsgiMessage) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                for name, value in SECURITY_HEADERS.items():
                    if name not in headers:
                        headers[name] = value
                if with_key and "cache-control" not in headers:
                    headers["Cache-Control"] = "no-store"
            await send(message)

        await self.app(scope, receive, send_with_headers)
