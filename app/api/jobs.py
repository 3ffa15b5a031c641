"""Routes of the `jobs` resource."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, Header, HTTPException, Query, Response, status

from app import jobs as service
from app import limits, rendering
from app.api import PageCursor, bad_cursor, json_response
from app.code import records as code_records
from app.config import get_settings
from app.datasets import records
from app.deps import CurrentUser, SessionDep, Submitter
from app.errors import responses
from app.models import Job as JobRow
from app.schemas import EpochMetrics, Job, JobPage, JobSpec, JobStatus
from app.webhooks import registration
from trainers.spec import Framework, Hardware

router = APIRouter(prefix="/jobs", tags=["jobs"], responses=responses(401, 404, 413, 503))


def owned_job(session: SessionDep, user: CurrentUser, job_id: str) -> JobRow:
    job = service.get_job(session, user, job_id)
    if job is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, service.not_found_message("job", job_id))
    return job


@router.post("", status_code=status.HTTP_201_CREATED, response_model=Job, responses=responses(409, 429))
def create_job(
    spec: JobSpec,
    session: SessionDep,
    user: Submitter,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
) -> Response:
    """Validate and store a job, then queue it on `<hardware>.<framework>`.

    Send an `Idempotency-Key` header to make retries safe: the same key and body return the
    same job; the same key with another body is 409.

    This server's limits (epochs, batch size, parameters, max_runtime_s, labels) may be lower
    than the schema's: a spec above one is 422 naming it. A spec without max_runtime_s gets the
    server's limit. A `webhook_url` must be one this server sends to (422 otherwise) and needs
    the key's signing secret (POST /webhooks/secret). A key with too many jobs queued, or too
    many submissions in the last minute
    (jobs created, and submissions refused as invalid: they count too), gets 429 (with
    Retry-After for the latter), before its body is validated."""
    spec = limits.capped_priority(spec, user)
    code_records.check_job(session, user, spec, spec.framework, get_settings())
    spec = cast(JobSpec, limits.apply_limits(records.with_dataset(session, user, spec), caller=user))
    registration.check_spec(session, user, spec)
    try:
        job, position = service.create_job(session, user, spec, idempotency_key)
    except service.IdempotencyConflict:
        raise HTTPException(
            status.HTTP_409_CONFLICT,
            "Idempotency-Key was already used with a different job spec; use a new key for a new job",
        ) from None
    return json_response(
        rendering.job(session, job, rendering.public_base(), position=position, admin=user.is_admin),
        status.HTTP_201_CREATED,
        headers={"Location": f"/jobs/{job.id}"},
    )


@router.get("", response_model=JobPage)
def list_jobs(
    session: SessionDep,
    user: CurrentUser,
    status_: Annotated[JobStatus | None, Query(alias="status")] = None,
    framework: Framework | None = None,
    hardware: Hardware | None = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
    cursor: PageCursor = None,
) -> Response:
    """The caller's jobs, newest first, filtered by status, framework and hardware."""
    try:
        page, next_cursor = service.list_jobs(
            session, user, status=status_, framework=framework, hardware=hardware, limit=limit, cursor=cursor
        )
    except ValueError as exc:
        raise bad_cursor(exc) from None
    served = service.online_queues(session)
    positions = service.queue_positions(session, page)
    base_url = rendering.public_base()
    return json_response(
        JobPage(
            items=[
                rendering.job(session, j, base_url, served, position=positions.get(j.id), admin=user.is_admin)
                for j in page
            ],
            next_cursor=next_cursor,
        )
    )


@router.get("/{job_id}", response_model=Job)
def read_job(job_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """One job: status, progress, metrics, timings, result, error and artifacts."""
    return json_response(
        rendering.job(session, owned_job(session, user, job_id), rendering.public_base(), admin=user.is_admin)
    )


@router.post("/{job_id}/cancel", status_code=status.HTTP_202_ACCEPTED, response_model=Job, responses=responses(409))
def cancel_job(job_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """Cancel a job: a queued one never runs; a running one stops after the step it is on
    and ends `cancelled` with the metrics of the epochs it finished. 409 if it already ended."""
    job = owned_job(session, user, job_id)
    try:
        job = service.cancel_job(session, job)
    except service.CannotCancel as exc:
        raise HTTPException(
            status.HTTP_409_CONFLICT, f"job {job_id} already {exc}; only queued or running jobs can be cancelled"
        ) from None
    return json_response(
        rendering.job(session, job, rendering.public_base(), admin=user.is_admin), status.HTTP_202_ACCEPTED
    )


@router.get("/{job_id}/metrics", response_model=list[EpochMetrics])
def read_metrics(job_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """Per-epoch metrics so far, in epoch order."""
    return json_response([EpochMetrics(**rendering.metric(m)) for m in owned_job(session, user, job_id).metrics])
