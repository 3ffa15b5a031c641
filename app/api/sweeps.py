"""Routes of the `sweeps` resource: a hyperparameter search whose trials are jobs."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Query, Response, status
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from app import jobs
from app.api import PageCursor, bad_cursor, json_response
from app.db import session_scope
from app.deps import CurrentUser, SessionDep, Submitter
from app.errors import responses
from app.keys import Caller
from app.models import Sweep as SweepRow
from app.sweeps import events, service, validate
from app.sweeps.spec import Sweep, SweepPage, SweepSpec, TrialPage

router = APIRouter(prefix="/sweeps", tags=["sweeps"], responses=responses(401, 404, 413, 503))


def owned_sweep(session: SessionDep, user: CurrentUser, sweep_id: str) -> SweepRow:
    sweep = service.get_sweep(session, user, sweep_id)
    if sweep is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, jobs.not_found_message("sweep", sweep_id))
    return sweep


@router.post("", status_code=status.HTTP_201_CREATED, response_model=Sweep, responses=responses(429))
def create_sweep(spec: SweepSpec, session: SessionDep, user: Submitter) -> Response:
    """Search the `space` of fields of the `base` job spec: trials are jobs, `parallelism` of
    them queued or running at once, until `max_trials` (or `max_total_s` of train time) is
    spent; with `early_stopping`, trials doing worse than the others at the same epoch end
    `pruned`. Every value of every dimension must make a job the server accepts (422 naming the
    dimension otherwise); the first trials count against the key's queued-jobs quota (429)."""
    base = validate.resolve_base(session, user, spec)
    validate.check(spec, base)
    sweep = service.create_sweep(session, user, spec, base)
    return json_response(
        service.render(session, sweep), status.HTTP_201_CREATED, headers={"Location": f"/sweeps/{sweep.id}"}
    )


@router.get("", response_model=SweepPage)
def list_sweeps(
    session: SessionDep, user: CurrentUser, limit: Annotated[int, Query(ge=1, le=100)] = 20, cursor: PageCursor = None
) -> Response:
    """The caller's sweeps, newest first, `limit` a page (pass `next_cursor` as `cursor` for the next)."""
    try:
        sweeps, next_cursor = service.list_sweeps(session, user, limit, cursor)
    except ValueError as exc:
        raise bad_cursor(exc) from None
    return json_response(SweepPage(items=[service.render(session, s) for s in sweeps], next_cursor=next_cursor))


@router.get("/{sweep_id}", response_model=Sweep)
def read_sweep(sweep_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """Status, trials by status, the best completed trial and its parameters, the budget used."""
    return json_response(service.render(session, owned_sweep(session, user, sweep_id)))


@router.get("/{sweep_id}/trials", response_model=TrialPage)
def read_trials(sweep_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """Every trial in order: its parameters, job, status, objective and epochs run."""
    sweep = owned_sweep(session, user, sweep_id)
    spec = SweepSpec.model_validate(sweep.spec)
    return json_response(TrialPage(items=service.trials(session, spec, service.trial_jobs(session, sweep.id))))


@router.post("/{sweep_id}/cancel", status_code=status.HTTP_202_ACCEPTED, response_model=Sweep)
def cancel_sweep(sweep_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """End the sweep: no new trial starts, queued trials are cancelled at once and running ones
    at their next step chunk. A sweep that already ended is answered as it is."""
    sweep = owned_sweep(session, user, sweep_id)
    service.cancel_sweep(session, sweep)
    return json_response(service.render(session, sweep), status.HTTP_202_ACCEPTED)


def _owned_id(user: Caller, sweep_id: str) -> str | None:
    with session_scope() as session:
        sweep = service.get_sweep(session, user, sweep_id)
        return sweep.id if sweep is not None else None


@router.get(
    "/{sweep_id}/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/event-stream": {}},
            "description": "`trial_start`, `trial_epoch`, `trial_end` and `sweep` events until the sweep ends.",
        },
        **responses(401, 404, 503),
    },
)
async def sweep_events(sweep_id: str, user: CurrentUser) -> StreamingResponse:
    """Server-sent events of a sweep, ending after it ends (see app/sweeps/events.py):

    - `trial_start` `{"trial", "params", "jobs"}`, `trial_epoch` `{"trial", "epoch", "objective"}`,
      `trial_end` `{"trial", "status", "objective", "pruned_at_epoch"}`;
    - `sweep` `{"id", "status", "trials", "best", "budget"}` whenever those change.

    A connection first gets the whole story so far; events carry no ids (a reconnect gets the
    story again, so nothing is missed). Each trial's job has its own stream, /jobs/{id}/events."""
    full_id = await run_in_threadpool(_owned_id, user, sweep_id)
    if full_id is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, jobs.not_found_message("sweep", sweep_id))
    return StreamingResponse(
        events.stream(full_id, user.id),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
