"""Routes of the `datasets` resource: upload, list, read, delete."""

from __future__ import annotations

import hashlib
import re
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

from anyio import to_thread
from fastapi import APIRouter, HTTPException, Query, Request, status
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect

from app.api import PageCursor, bad_cursor
from app.config import Settings, get_settings
from app.datasets import records, upload
from app.datasets.formats import FORMATS, DatasetRejected, UploadLimits, UploadOptions, parse_upload
from app.db import session_scope
from app.deps import CurrentUser, SessionDep
from app.errors import responses
from app.keys import Caller
from app.limits import _has_control
from trainers import dataset_file

router = APIRouter(prefix="/datasets", tags=["datasets"], responses=responses(401, 404, 503))

IMAGE_SIZE = re.compile(r"^([1-9][0-9]{0,4})(?:x([1-9][0-9]{0,4}))?$")


class DatasetOptions(BaseModel):
    """How to read an upload, from the query string or the multipart form's text fields (an
    unknown one is refused: a typo more often than not)."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=200)] | None = None
    label_column: Annotated[str, Field(min_length=1, max_length=200)] = "label"
    task: Literal["classification", "regression"] | None = None
    format: Literal["npz", "idx", "csv", "parquet", "imagefolder"] | None = None
    image_size: Annotated[str, Field(pattern=IMAGE_SIZE.pattern)] | None = Field(
        None, description="HEIGHTxWIDTH (or one number for square images) to resize ImageFolder images to."
    )

    def upload_options(self, filename: str | None) -> UploadOptions:
        size = None
        if self.image_size and (match := IMAGE_SIZE.match(self.image_size)):
            size = (int(match[1]), int(match[2] or match[1]))
        return UploadOptions(
            filename=filename, format=self.format, label_column=self.label_column, task=self.task, image_size=size
        )


def _limits(settings: Settings) -> UploadLimits:
    return UploadLimits(
        max_examples=settings.max_dataset_examples,
        max_unpacked_bytes=settings.max_dataset_unpacked_bytes,
        max_files=settings.max_dataset_files,
        max_image_pixels=settings.max_image_pixels,
    )


def _rejected(where: str, message: str, code: int = 422) -> JSONResponse:
    loc = ["body", "file", *([where] if where else [])]
    if code == 413:
        return JSONResponse({"detail": message}, status_code=413)
    return JSONResponse({"detail": [{"type": "invalid_dataset", "loc": loc, "msg": message}]}, status_code=code)


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    responses={**responses(400, 413), 200: {"description": "The same content was uploaded before by this key."}},
    openapi_extra={
        "requestBody": {
            "description": "The dataset file as the body (its Content-Type), or multipart/form-data with one "
            f"file part and the options as text fields. Formats: {', '.join(FORMATS)}.",
            "content": {"application/octet-stream": {}, "multipart/form-data": {}},
        }
    },
)
async def upload_dataset(
    request: Request,
    user: CurrentUser,
    options: Annotated[DatasetOptions, Query()],
) -> Response:
    """Upload a dataset, validated fully now (a job never finds a bad one later), stored in one
    normalised form. 201 with the dataset; 200 with the existing one when this key uploaded the
    same content before. A body over TRAINHUB_MAX_DATASET_BYTES, an archive that unpacks past the
    limits, or a key over its stored bytes (TRAINHUB_MAX_DATASET_BYTES_PER_KEY) is 413; a file
    that is not a valid dataset is 422 naming the problem, the part, and the row, column or
    array. Nothing is stored on any refusal."""
    settings = get_settings()
    used = await to_thread.run_sync(_used_bytes, user)
    try:
        records.check_room(used, 1, settings)
    except records.OverQuota as exc:
        return JSONResponse({"detail": exc.message}, status_code=413)
    try:
        received = await upload.receive(request, settings.resolved_upload_dir(), settings.max_dataset_bytes)
    except upload.UploadTooLarge as exc:
        return JSONResponse(
            {
                "detail": f"dataset upload larger than this server's limit of {exc.limit:,} bytes "
                "(max_dataset_bytes, set by TRAINHUB_MAX_DATASET_BYTES)"
            },
            status_code=413,
        )
    except upload.BadUpload as exc:
        return JSONResponse({"detail": str(exc)}, status_code=400)
    except ClientDisconnect:  # the client left mid-upload: nobody to answer, nothing kept
        return Response(status_code=400)
    try:
        return await to_thread.run_sync(_store_upload, user, received, options, settings)
    finally:
        received.path.unlink(missing_ok=True)


def _used_bytes(user: Caller) -> int:
    with session_scope() as session:
        return records.stored_bytes(session, user)


def _store_upload(user: Caller, received: upload.Received, query: DatasetOptions, settings: Settings) -> Response:
    """Parse, validate, normalise and store one received upload (in a worker thread: it is CPU work)."""
    try:
        options = DatasetOptions.model_validate({**query.model_dump(exclude_unset=True), **received.fields})
    except ValidationError as exc:
        return JSONResponse(
            {
                "detail": [
                    {"type": e["type"], "loc": ["body", *map(str, e["loc"])], "msg": e["msg"]} for e in exc.errors()
                ]
            },
            status_code=422,
        )
    name = options.name or _default_name(received.filename)
    if _has_control(name):
        return _rejected("name", "name may not hold control characters", 422)
    try:
        data = parse_upload(received.path, options.upload_options(received.filename), _limits(settings))
    except DatasetRejected as exc:
        return _rejected(exc.where, exc.message, exc.status)
    with tempfile.NamedTemporaryFile(dir=received.path.parent, prefix=".normalised-", suffix=".safetensors") as out:
        normalised = Path(out.name)
        dataset_file.write(normalised, data)
        sha256 = _sha256(normalised)
        with session_scope() as session:
            try:
                row, created = records.store(
                    session,
                    user,
                    data,
                    normalised,
                    sha256,
                    name=name,
                    upload_bytes=received.size,
                    settings=settings,
                )
            except records.OverQuota as exc:
                return JSONResponse({"detail": exc.message}, status_code=413)
            body = records.render(row)
    headers = {"Location": f"/datasets/{body['id']}"}
    return JSONResponse(body, status_code=201 if created else 200, headers=headers)


def _default_name(filename: str | None) -> str:
    """The upload's file name without its folders and extension; "dataset" when there is none."""
    base = re.split(r"[\\/]", filename or "")[-1]
    stem = base.split(".", 1)[0].strip()
    return stem[:200] or "dataset"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@router.get("")
def list_datasets(
    session: SessionDep, user: CurrentUser, limit: Annotated[int, Query(ge=1, le=200)] = 100, cursor: PageCursor = None
) -> Response:
    """The key's datasets, newest first, `limit` a page (pass `next_cursor` as `cursor` for the
    next); the first page starts with the built-in ones this deployment has (marked `built_in`,
    with their shapes)."""
    try:
        own, next_cursor = records.owned(session, user, limit, cursor)
    except ValueError as exc:
        raise bad_cursor(exc) from None
    built_in = [] if cursor else [records.render_built_in(name) for name in records.available_built_ins(session)]
    return JSONResponse({"items": [*built_in, *map(records.render, own)], "next_cursor": next_cursor})


def _owned(session: SessionDep, user: CurrentUser, dataset_id: str) -> Any:
    row = records.find(session, user, dataset_id)
    if row is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, f"dataset {dataset_id[:60]} not found")
    return row


@router.get("/{dataset_id}")
def read_dataset(dataset_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """One dataset: its shapes, classes, split sizes, bytes and sha256."""
    return JSONResponse(records.render(_owned(session, user, dataset_id)))


@router.delete("/{dataset_id}", status_code=status.HTTP_204_NO_CONTENT, responses=responses(409))
def delete_dataset(dataset_id: str, session: SessionDep, user: CurrentUser) -> Response:
    """Delete a dataset. 409 while a queued or running job uses it; finished jobs keep the sha256
    they trained on (in their spec)."""
    row = _owned(session, user, dataset_id)
    try:
        records.delete(session, row, get_settings())
    except records.InUse as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, exc.detail(f"dataset {dataset_id}")) from None
    return Response(status_code=status.HTTP_204_NO_CONTENT)
