"""The HTTP routers, one module per resource."""

from __future__ import annotations

from typing import Annotated

from fastapi import HTTPException, Query, status
from pydantic import BaseModel
from starlette.responses import Response


def json_response(
    content: BaseModel | list[BaseModel], status_code: int = 200, headers: dict[str, str] | None = None
) -> Response:
    """`content` (a model, or a list of them) as JSON, sent as it is. Every route of a resource
    answers this way, for two reasons. A model returned plainly is validated again against the
    route's response_model, and for a sync route in one more thread-pool hop, while the request's
    session still holds its database connection: under load, requests holding every connection
    would wait for threads that all wait for a connection (a deadlock until the pool timeout).
    And that validation is work done twice: the routes build these models from their schemas."""
    if isinstance(content, BaseModel):
        body = content.model_dump_json()
    else:
        body = "[" + ",".join(item.model_dump_json() for item in content) + "]"
    return Response(body, status_code=status_code, headers=headers, media_type="application/json")


# A list's page: how many items, and where the previous page ended (its `next_cursor`).
PageCursor = Annotated[str | None, Query(max_length=500, description="the previous page's next_cursor")]


def bad_cursor(exc: ValueError) -> HTTPException:
    """The 422 for a cursor this API did not hand out (app.pages raises ValueError), naming it."""
    return HTTPException(
        status.HTTP_422_UNPROCESSABLE_CONTENT, [{"loc": ["query", "cursor"], "msg": str(exc), "type": "value_error"}]
    )
