"""Route of the Prometheus metrics (see app/metrics.py for what they are)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app import metrics
from app.deps import CurrentUser
from app.errors import responses

router = APIRouter(tags=["health"])


@router.get(
    "/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}, **responses(401, 503)}
)
def prometheus_metrics(user: CurrentUser) -> Response:
    """Prometheus text format: jobs by status, queue depth by queue, workers online, job and
    epoch durations as histograms. Like every API route it takes an API key (Prometheus:
    `authorization: {credentials: th_...}` in the scrape config). An admin key or a scrape key
    (`trainhub keys create --scrape`) reads the service-wide numbers (and the API process's and
    retention's); a user key reads the same families over its own jobs only."""
    wide = user.is_admin or user.scrape_only
    return Response(metrics.render(None if wide else user.id), media_type=CONTENT_TYPE_LATEST)
