"""Routes of the `comparisons` resource: one spec, trained in JAX and in PyTorch."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, HTTPException, Query, Response, status

from app import comparisons as service
from app import jobs, limits, rendering
from app.api import PageCursor, bad_cursor, json_response
from app.code import records as code_records
from app.config import get_settings
from app.datasets import records
from app.deps import CurrentUser, SessionDep, Submitter
from app.errors import responses
from app.models import Comparison as ComparisonRow
from app.schemas import Comparison, ComparisonPage, ComparisonSpec
from app.webhooks import registration

router = APIRouter(prefix="/comparisons", tags=["comparisons"], responses=responses(401, 404, 413, 503))


def owned_comparison(session: SessionDep, user: CurrentUser, comparison_id: str) -> ComparisonRow:
    comparison = service.get_comparison(session, user, comparison_id)
    if comparison is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, jobs.not_found_message("comparison", comparison_id))
    return comparison


def render(session: SessionDep, comparison: ComparisonRow, user: CurrentUser) -> Comparison:
    return rendering.comparison(session, comparison, rendering.public_base(), admin=user.is_admin)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=Comparison, responses=responses(429))
def create_comparison(spec: ComparisonSpec, session: SessionDep, user: Submitter) -> Response:
    """Train the spec (no `framework`) once with JAX and once with PyTorch, on the same hardware,
    from the same initial weights and with the same batch order. The two jobs count as two
    against the key's limits (429 when over one); the spec meets this server's limits as in
    `POST /jobs`. A `webhook_url` gets the status changes of both jobs (each event names the
    comparison)."""
    spec = limits.capped_priority(spec, user)
    code_records.check_job(session, user, spec, None, get_settings())
    spec = cast(ComparisonSpec, limits.apply_limits(records.with_dataset(session, user, spec), caller=user))
    registration.check_spec(session, user, spec)
    comparison = service.create_comparison(session, user, spec)
    return json_response(
        render(session, comparison, user),
        status.HTTP_201_CREATED,
        headers={"Location": f"/comparisons/{comparison.id}"},
    )


@router.get("", response_model=ComparisonPage)
def list_comparisons(
    session: SessionDep,
    user: CurrentUser,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    cursor: PageCursor = None,
) -> Response:
    """The caller's comparisons, newest first, `limit` a page (pass `next_cursor` as `cursor` for
    the next)."""
    try:
        page, next_cursor = service.list_comparisons(session, user, limit, cursor)
    except ValueError as exc:
        raise bad_cursor(exc) from None
    return json_response(ComparisonPage(items=[render(session, c, user) for c in page], next_cursor=next_cursor))


@router.get("/{comparison_id}", response_model=Comparison)
def read_comparison(comparison_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """Both jobs, the parity check and, once both succeeded, the side-by-side table."""
    return json_response(render(session, owned_comparison(session, user, comparison_id), user))


@router.post("/{comparison_id}/cancel", status_code=status.HTTP_202_ACCEPTED, response_model=Comparison)
def cancel_comparison(comparison_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """Cancel both jobs (those still queued or running)."""
    comparison = owned_comparison(session, user, comparison_id)
    service.cancel_comparison(session, comparison)
    session.refresh(comparison)
    return json_response(render(session, comparison, user), status.HTTP_202_ACCEPTED)
