"""Route of a job's server-sent events (see app/events.py for what is sent and how ids work)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, status
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from app import events
from app import jobs as service
from app.db import session_scope
from app.deps import CurrentUser
from app.errors import responses
from app.keys import Caller

router = APIRouter(prefix="/jobs", tags=["jobs"])


def _owned_id(user: Caller, job_id: str) -> str | None:
    """The full id of the user's job `job_id` (an id or a unique prefix), or None."""
    with session_scope() as session:
        job = service.get_job(session, user, job_id)
        return job.id if job is not None else None


@router.get(
    "/{job_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`status`, `metrics` and `waiting` events until the job ends.",
        },
        **responses(401, 404, 503),
    },
)
async def job_events(
    job_id: str,
    user: CurrentUser,
    last_event_id: Annotated[str | None, Header(max_length=40)] = None,
) -> StreamingResponse:
    """Server-sent events of one job, ending after its final status.

    - `status` (id 0 queued, 1 running, epochs + 2 the final one): `{"status", "at", "progress", ...}`;
      the final one carries `result`, `error` (for a failed job: `type` from the closed list of
      the Job's `error`, `message`, `reason`), `retries` and `timings`.
    - `metrics` (id 1 + epoch): one epoch's metrics, as in `GET /jobs/{id}/metrics`, plus `progress`.
    - `waiting` (no id): `{"waiting_reason"}` when why a queued job waits changes (a job the retry
      policy sent back says after which failure).

    Reconnect with `Last-Event-ID` to get only what came after (browsers' EventSource does this
    itself). The API key goes in the `Authorization` header as everywhere else: EventSource
    cannot send one, so the dashboard reads this stream with `fetch`."""
    full_id = await run_in_threadpool(_owned_id, user, job_id)  # the id itself, also for a short one
    if full_id is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, service.not_found_message("job", job_id))
    return StreamingResponse(
        events.stream(full_id, events.parse_last_event_id(last_event_id), user.id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
