"""Routes of a job's artifacts: list and download (Range requests honoured)."""

from __future__ import annotations

import re
from urllib.parse import quote

from fastapi import APIRouter, HTTPException, Request, status
from fastapi.responses import FileResponse, Response, StreamingResponse  # FileResponse: the schema only
from starlette.concurrency import iterate_in_threadpool

from app import rendering, storage
from app.api import json_response
from app.api.jobs import owned_job
from app.deps import CurrentUser, SessionDep
from app.errors import responses
from app.schemas import ArtifactInfo

router = APIRouter(prefix="/jobs/{job_id}/artifacts", tags=["artifacts"], responses=responses(401, 404, 503))

_UNSAFE_IN_FILENAME = re.compile(r"[^A-Za-z0-9._-]")


def is_plain_name(name: str) -> bool:
    """A name that could be an artifact's: no path separators (raw or decoded from %2F), no
    NUL or other control characters, not `.` or `..`. Anything else is 404 before any lookup."""
    return (
        0 < len(name) <= 200
        and name not in (".", "..")
        and not any(c in name for c in "/\\\x00")
        and name.isprintable()
    )


def content_disposition(name: str) -> str:
    """`attachment` with a file name safe in any browser and shell: ASCII letters, digits, `.`,
    `_` and `-` (others become `_`, no leading dot), plus the exact name RFC 5987-encoded."""
    ascii_name = _UNSAFE_IN_FILENAME.sub("_", name).lstrip(".")[:150] or "artifact"
    header = f'attachment; filename="{ascii_name}"'
    if ascii_name != name:
        header += f"; filename*=UTF-8''{quote(name, safe='')}"
    return header


@router.get("", response_model=list[ArtifactInfo])
def list_artifacts(job_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """The job's files with their size in bytes, sha256 and download URL."""
    job = owned_job(session, user, job_id)
    base = rendering.public_base()
    return json_response(
        [ArtifactInfo(**rendering.artifact(a, f"{base}/jobs/{job.id}/artifacts/{a.name}")) for a in job.artifacts]
    )


@router.head("/{name}", response_class=FileResponse, include_in_schema=False)  # one operation id: GET's
@router.get(
    "/{name}",
    response_class=FileResponse,
    responses={
        200: {"content": {"application/octet-stream": {}}, "description": "The file."},
        206: {"content": {"application/octet-stream": {}}, "description": "The byte range asked for."},
        416: {"description": "The byte range lies outside the file."},
    },
)
def download_artifact(job_id: str, name: str, request: Request, session: SessionDep, user: CurrentUser) -> Response:
    """The file itself, from where the worker stored it (the artifact dir or an S3 bucket).
    Only names the job recorded are served; a name never becomes a path. A single
    `Range: bytes=...` is answered 206 with that part."""
    job = owned_job(session, user, job_id)
    missing = HTTPException(status.HTTP_404_NOT_FOUND, f"job {job_id} has no artifact named {name!r}")
    if not is_plain_name(name):
        raise missing
    artifact = next((a for a in job.artifacts if a.name == name), None)
    if artifact is None:
        raise missing
    session.close()  # the file may take minutes to send: its connection goes back to the pool now
    store = storage.store_for(artifact.path)
    try:
        return _file_response(store, artifact.path, artifact.name, request)
    except storage.ArtifactMissing:
        raise missing from None
    except storage.StoreUnavailable as exc:
        raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE, f"the artifact store is unavailable: {exc}") from None


def _file_response(
    store: storage.LocalStore | storage.S3Store, location: str, filename: str, request: Request
) -> Response:
    """The artifact, or the one byte range its `Range` header asks for (storage.parse_range), the
    same way whichever store holds it: 200 whole, 206 with Content-Range, 416 when unsatisfiable."""
    size = store.size(location)
    headers = {"Accept-Ranges": "bytes", "Content-Disposition": content_disposition(filename)}
    try:
        byte_range = storage.parse_range(request.headers.get("range"), size)
    except storage.Unsatisfiable:
        return Response(
            status_code=status.HTTP_416_RANGE_NOT_SATISFIABLE,
            headers={"Content-Range": f"bytes */{size}", "Accept-Ranges": "bytes"},
        )
    if byte_range is None:
        status_code, length = status.HTTP_200_OK, size
    else:
        status_code, length = status.HTTP_206_PARTIAL_CONTENT, byte_range.length
        headers["Content-Range"] = f"bytes {byte_range.start}-{byte_range.end}/{size}"
    headers["Content-Length"] = str(length)
    if request.method == "HEAD" or length == 0:
        return Response(status_code=status_code, headers=headers, media_type="application/octet-stream")
    # File and botocore reads block: pull each chunk in the threadpool, not on the event loop.
    body = iterate_in_threadpool(store.stream(location, byte_range))
    return StreamingResponse(body, status_code=status_code, headers=headers, media_type="application/octet-stream")
