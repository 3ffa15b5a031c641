"""The HTTP routers, one module per resource."""

from __future__ import annotations

from pydantic import BaseModel
from starlette.responses import Response


def json_response(model: BaseModel, status_code: int = 200, headers: dict[str, str] | None = None) -> Response:
    """`model` as JSON, sent as it is. For the routes polled most (GET and POST /jobs): a model
    returned plainly is validated again against the route's response_model, and for a sync route
    in one more thread-pool hop, though to_schema has just built it from that model."""
    return Response(model.model_dump_json(), status_code=status_code, headers=headers, media_type="application/json")
