"""Dataset records: store a validated upload, list, find, delete; and what a job's spec names.

The data is stored once per content (the artifact store's `datasets/<sha256>.safetensors`) and
shared by every key that uploads the same; each key has its own record of it. A key's quota
counts the stored bytes of its records.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import pages, storage, uploads
from app.config import Settings
from app.heartbeats import recent_workers
from app.keys import Caller
from app.limits import lock_key
from app.models import Dataset, Job, rfc3339, utcnow
from trainers.dataset_file import DatasetArrays
from trainers.spec import BUILT_IN, DatasetInfo, TrainingSpec

STORE_FOLDER = "datasets"  # in the artifact store, beside the jobs' folders (job ids are UUIDs)
# Built-in datasets every worker has: generated, or bundled with scikit-learn.
ALWAYS_AVAILABLE = ("digits", "synthetic")


@dataclass
class OverQuota(Exception):
    """Storing the dataset would pass the key's stored-bytes quota (413)."""

    message: str


InUse = uploads.InUse


def new_id() -> str:
    return f"ds_{uuid.uuid4().hex}"


def stored_bytes(session: Session, owner: Caller) -> int:
    """Bytes of the stored form of the key's datasets."""
    total = session.scalar(select(func.coalesce(func.sum(Dataset.bytes), 0)).where(Dataset.owner_id == owner.id))
    return int(total or 0)


def check_room(used: int, adding: int, settings: Settings) -> None:
    """Raise OverQuota when `adding` bytes to the `used` ones passes the key's quota."""
    limit = settings.max_dataset_bytes_per_key
    if used + adding > limit:
        raise OverQuota(
            f"this key stores {used:,} bytes of datasets and this one needs {adding:,} more; the limit is "
            f"{limit:,} bytes (max_dataset_bytes_per_key, set by TRAINHUB_MAX_DATASET_BYTES_PER_KEY): "
            "delete datasets you no longer need (DELETE /datasets/{id})"
        )


def store(
    session: Session,
    owner: Caller,
    data: DatasetArrays,
    normalised: Path,
    sha256: str,
    *,
    name: str,
    upload_bytes: int,
    settings: Settings,
) -> tuple[Dataset, bool]:
    """(the record, created?) for `normalised` (trainers.dataset_file's form of `data`, hashing to
    `sha256`): the key's existing record of the same content, or a new one. The stored file is
    written again either way, so uploading a dataset again repairs a lost or damaged copy. The
    key's row is locked while its quota is counted, so concurrent uploads of one key are counted
    one after another. Raises OverQuota (nothing stored)."""
    lock_key(session, owner)
    lock_content(session, sha256)
    existing = session.scalars(select(Dataset).where(Dataset.owner_id == owner.id, Dataset.sha256 == sha256)).first()
    if existing is not None:
        existing.location = storage.get_store(settings).put(STORE_FOLDER, f"{sha256}.safetensors", normalised)
        session.commit()
        return existing, False
    size = normalised.stat().st_size
    try:
        check_room(stored_bytes(session, owner), size, settings)
    except OverQuota:
        session.rollback()
        raise
    location = storage.get_store(settings).put(STORE_FOLDER, f"{sha256}.safetensors", normalised)
    row = Dataset(
        id=new_id(),
        owner_id=owner.id,
        name=name,
        format=data.source_format,
        task=data.task,
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        class_names=data.class_names,
        train_size=len(data.x_train),
        test_size=0 if data.x_test is None else len(data.x_test),
        bytes=size,
        upload_bytes=upload_bytes,
        sha256=sha256,
        location=location,
        created_at=utcnow(),
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:  # the same key stored the same content a moment ago
        session.rollback()
        earlier = session.scalars(select(Dataset).where(Dataset.owner_id == owner.id, Dataset.sha256 == sha256)).one()
        return earlier, False
    return row, True


SHORT_ID = re.compile(r"ds_[0-9a-f]{8,31}")


def find(session: Session, owner: Caller, dataset_id: str) -> Dataset | None:
    """The record `dataset_id` names if `owner` may see it (its own; an admin key any): the whole
    id, or `ds_` and at least 8 of its hex digits when exactly one such record starts with them."""
    if SHORT_ID.fullmatch(dataset_id):
        query = select(Dataset).where(Dataset.id.startswith(dataset_id, autoescape=True)).limit(2)
        if not owner.is_admin:
            query = query.where(Dataset.owner_id == owner.id)
        found = list(session.scalars(query))
        return found[0] if len(found) == 1 else None
    row = session.get(Dataset, dataset_id)
    return row if row is not None and (row.owner_id == owner.id or owner.is_admin) else None


def owned(session: Session, owner: Caller, limit: int, cursor: str | None) -> tuple[list[Dataset], str | None]:
    """The key's datasets, newest first: a page of `limit` after `cursor`, and the next page's cursor
    (app.pages). Raises ValueError for a cursor this API did not hand out."""
    return pages.page(session, select(Dataset).where(Dataset.owner_id == owner.id), Dataset, limit, cursor)


def delete(session: Session, row: Dataset, settings: Settings) -> None:
    """Delete the record; the stored data too when no other record shares it. Raises InUse while
    queued or running jobs or a running sweep train on it (finished jobs keep the sha256 they
    trained on)."""
    uploads.delete(session, row, Job.dataset_id, lambda base: (base.get("dataset") or {}).get("id") == row.id, settings)


def locations_of(session: Session, dataset_id: str | None, sha256: str) -> list[str]:
    """Where the stored data of `sha256` lies, for a worker to fetch: the record `dataset_id`'s
    location first, then those of other records of the same content (another deployment's store,
    before a change of store), each once."""
    rows = session.execute(select(Dataset.id, Dataset.location).where(Dataset.sha256 == sha256)).all()
    ordered = sorted(rows, key=lambda row: row.id != dataset_id)
    return list(dict.fromkeys(row.location for row in ordered))


lock_content = uploads.lock_content


def render(row: Dataset) -> dict[str, Any]:
    """The HTTP form of a record."""
    return {
        "id": row.id,
        "name": row.name,
        "built_in": False,
        "format": row.format,
        "task": row.task,
        "input_shape": row.input_shape,
        "num_classes": row.num_classes,
        "class_names": row.class_names,
        "train_size": row.train_size,
        "test_size": row.test_size,
        "bytes": row.bytes,
        "upload_bytes": row.upload_bytes,
        "sha256": row.sha256,
        "created_at": rfc3339(row.created_at),
        "owner": row.owner_id,
    }


# --- built-in datasets ------------------------------------------------------------------------


def available_built_ins(session: Session) -> list[str]:
    """The built-in datasets this deployment has: those a recently seen worker reported having
    (workers report them with every heartbeat), and the ones every worker has."""
    reported = {name for worker in recent_workers(session) for name in (worker.datasets or [])}
    return [name for name in BUILT_IN if name in reported or name in ALWAYS_AVAILABLE]


def workers_reported(session: Session) -> bool:
    """Whether any recently seen worker said which built-in datasets it has."""
    return any(worker.datasets is not None for worker in recent_workers(session))


def render_built_in(name: str) -> dict[str, Any]:
    shape = BUILT_IN[name]
    return {
        "id": None,
        "name": name,
        "built_in": True,
        "task": shape.task,
        "input_shape": list(shape.input_shape),
        "num_classes": shape.num_classes,
        "train_size": shape.train_size,
        "test_size": shape.test_size,
    }


# --- a job's dataset --------------------------------------------------------------------------


class DatasetUnavailable(Exception):
    """The spec names a dataset the key cannot use or no worker has: 422 items (FastAPI shape)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.errors = [{"type": "value_error", "loc": ["body", "dataset", field], "msg": message}]


def resolve(session: Session, owner: Caller, spec: TrainingSpec) -> dict[str, Any]:
    """The spec as a dict with its uploaded dataset's `info` (and `standardize`) filled in from the
    record; the caller validates it again. Raises DatasetUnavailable when the request sets `info`
    itself, names a dataset the key may not use (another key's is "not found", like a missing
    one), or a built-in dataset no worker has."""
    dataset = spec.dataset
    if "info" in dataset.model_fields_set:
        raise DatasetUnavailable("info", "dataset.info is set by the server from the dataset's record: leave it out")
    body = spec.model_dump(mode="json")
    if dataset.id is None:
        _check_built_in(session, dataset.name or "")
        return body
    row = find(session, owner, dataset.id)
    if row is None:
        raise DatasetUnavailable("id", f"dataset {dataset.id} not found: GET /datasets lists the ones this key has")
    info = DatasetInfo(
        sha256=row.sha256,
        task=row.task,  # type: ignore[arg-type]  # stored from TASKS
        input_shape=row.input_shape,
        num_classes=row.num_classes,
        train_size=row.train_size,
        test_size=row.test_size,
    )
    body["dataset"] |= {"info": info.model_dump(mode="json"), "standardize": dataset.uses_standardize}
    return body


SpecT = TypeVar("SpecT", bound=TrainingSpec)


def with_dataset(session: Session, owner: Caller, spec: SpecT) -> SpecT:
    """`spec` validated again with its dataset's record filled in (see `resolve`): shapes, classes
    and split sizes now check the model and batch size. Raises RequestValidationError (422, loc
    under body) when the dataset cannot be used or the spec does not fit it."""
    try:
        body = resolve(session, owner, spec)
        return type(spec).model_validate(body)
    except DatasetUnavailable as exc:
        raise RequestValidationError(exc.errors) from None
    except ValidationError as exc:
        errors = [{**error, "loc": ("body", *error["loc"])} for error in exc.errors()]
        raise RequestValidationError(errors) from None


def _check_built_in(session: Session, name: str) -> None:
    if name in ALWAYS_AVAILABLE or not workers_reported(session):
        return  # before any worker reported, nothing is known: the job waits for one
    available = available_built_ins(session)
    if name not in available:
        raise DatasetUnavailable(
            "name",
            f"dataset {name!r} is not installed on any worker of this deployment (they have: "
            f"{', '.join(available)}); upload it (POST /datasets) or ask the operator to install it",
        )
