"""Routes of the `code` resource: upload, list, read, delete (user model code, opt-in)."""

from __future__ import annotations

from typing import Annotated

from anyio import to_thread
from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from app.api import PageCursor, bad_cursor
from app.code import records
from app.code.package import CodeLimits, CodeRejected, read_package
from app.config import Settings, get_settings
from app.datasets import upload
from app.db import session_scope
from app.deps import CurrentUser, SessionDep
from app.errors import responses
from app.keys import Caller
from app.limits import _has_control
from app.models import CodeUpload

router = APIRouter(prefix="/code", tags=["code"], responses=responses(401, 403, 404, 503))


def _limits(settings: Settings) -> CodeLimits:
    return CodeLimits(
        max_files=settings.max_code_files,
        max_file_bytes=settings.max_code_file_bytes,
        max_unpacked_bytes=settings.max_code_unpacked_bytes,
    )


def _rejected(message: str, code: int = 422) -> JSONResponse:
    if code == 413:
        return JSONResponse({"detail": message}, status_code=413)
    detail = [{"type": "invalid_code", "loc": ["body", "file"], "msg": message}]
    return JSONResponse({"detail": detail}, status_code=code)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={**responses(400, 413), 200: {"description": "The same code was uploaded before by this key."}},
    openapi_extra={
        "requestBody": {
            "description": "One .py file or a .zip of them (and a few text files) as the body, or "
            "multipart/form-data with one file part.",
            "content": {"application/octet-stream": {}, "multipart/form-data": {}},
        }
    },
)
async def upload_code(
    request: Request,
    user: CurrentUser,
    filename: Annotated[
        str | None, Query(max_length=200, description="The file's name (model.py) for a raw body.")
    ] = None,
    name: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    entrypoint: Annotated[
        list[str] | None, Query(max_length=20, description="Entrypoints (module:function) that must be in it.")
    ] = None,
) -> Response:
    """Upload model code: checked now (names, sizes, every module parses, the entrypoints named
    exist as top-level functions), never run by the API. 201 with the record, whose
    `entrypoints` lists every top-level function as `module:function` with the framework it
    builds for when its source says; 200 with the existing one when this key uploaded the same
    before. 403 when the deployment or the key may not use user code; 413 past a size or count
    limit (TRAINHUB_MAX_CODE_*); 422 naming the file otherwise. Nothing is stored on a refusal."""
    settings = get_settings()
    records.check_allowed(user, settings)
    try:
        received = await upload.receive(request, settings.resolved_upload_dir(), settings.max_code_bytes)
    except upload.UploadTooLarge as exc:
        return _rejected(
            f"code upload larger than this server's limit of {exc.limit:,} bytes "
            "(max_code_bytes, set by TRAINHUB_MAX_CODE_BYTES)",
            413,
        )
    except upload.BadUpload as exc:
        return JSONResponse({"detail": str(exc).replace("dataset", "code")}, status_code=400)
    except ClientDisconnect:
        return Response(status_code=400)
    try:
        return await to_thread.run_sync(_store, user, received, filename, name, entrypoint or [], settings)
    finally:
        received.path.unlink(missing_ok=True)


def _store(
    user: Caller,
    received: upload.Received,
    filename: str | None,
    name: str | None,
    wanted: list[str],
    settings: Settings,
) -> Response:
    try:
        package = read_package(received.path, received.filename or filename, _limits(settings))
    except CodeRejected as exc:
        return _rejected(exc.message, exc.status)
    missing = [e for e in wanted if e not in package.entrypoints]
    if missing:
        found = ", ".join(sorted(package.entrypoints)[:20]) or "none"
        return _rejected(f"no top-level function {', '.join(missing)} (module:function) in the upload; it has: {found}")
    shown = name or (received.filename or filename or "code").replace("\\", "/").rsplit("/", 1)[-1][:200]
    if _has_control(shown):
        return _rejected("name may not hold control characters")
    with session_scope() as session:
        row, created = records.store(session, user, package, shown, settings)
        body = records.render(row)
    return JSONResponse(body, status_code=201 if created else 200, headers={"Location": f"/code/{body['id']}"})


@router.get("")
def list_code(
    session: SessionDep, user: CurrentUser, limit: Annotated[int, Query(ge=1, le=200)] = 100, cursor: PageCursor = None
) -> Response:
    """The key's uploaded code, newest first, `limit` a page (pass `next_cursor` as `cursor` for
    the next)."""
    try:
        rows, next_cursor = records.owned(session, user, limit, cursor)
    except ValueError as exc:
        raise bad_cursor(exc) from None
    return JSONResponse({"items": [records.render(row) for row in rows], "next_cursor": next_cursor})


def _owned(session: SessionDep, user: CurrentUser, code_id: str) -> CodeUpload:
    row = records.find(session, user, code_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"code {code_id[:60]} not found")
    return row


@router.get("/{code_id}")
def read_code(code_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """One upload: its files, entrypoints, bytes and sha256."""
    return JSONResponse(records.render(_owned(session, user, code_id)))


@router.delete("/{code_id}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(409))
def delete_code(code_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """Delete uploaded code. 409 while a queued or running job uses it."""
    row = _owned(session, user, code_id)
    try:
        records.delete(session, row, get_settings())
    except records.InUse as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, exc.detail(f"code {code_id}")) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)
