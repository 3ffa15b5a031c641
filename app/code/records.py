"""Code records: who may use user code, store a checked package, list, find, delete; and the
checks a job that names code gets at submission.

The files are stored once per content (the artifact store's `code/<sha256>.json`, a JSON object
{name: text}) and shared by every key that uploads the same; each key has its own record.
"""

from __future__ import annotations

import re
import tempfile
import uuid
from pathlib import Path
from typing import Any

from fastapi import HTTPException, status
from fastapi.exceptions import RequestValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from app import pages, storage, uploads
from app.code.package import Package
from app.config import Settings
from app.keys import Caller
from app.models import CodeUpload, Job, rfc3339, utcnow
from trainers.spec import TrainingSpec

STORE_FOLDER = "code"  # in the artifact store, beside the jobs' folders and "datasets"
SHORT_ID = re.compile(r"code_[0-9a-f]{8,31}")


InUse = uploads.InUse


def check_allowed(user: Caller, settings: Settings) -> None:
    """403 naming the reason unless this deployment runs user code and the key may."""
    if not settings.allow_user_code:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "user code is off on this deployment: its operator turns it on with TRAINHUB_ALLOW_USER_CODE=1 "
            "(see the README's security section first)",
        )
    if not user.allow_code:
        raise HTTPException(
            status.HTTP_403_FORBIDDEN,
            "this API key may not upload or run model code: an admin allows it with "
            "`trainhub keys code KEY --allow` (or creates a key with `trainhub keys create --allow-code`)",
        )


def new_id() -> str:
    return f"code_{uuid.uuid4().hex}"


def store(session: Session, owner: Caller, package: Package, name: str, settings: Settings) -> tuple[CodeUpload, bool]:
    """(the record, created?) for `package`: the key's record of the same content, or a new one.
    The stored file is written again either way (an upload repairs a lost copy)."""
    sha256 = package.sha256
    uploads.lock_content(session, sha256)
    with tempfile.NamedTemporaryFile(prefix=".code-", suffix=".json") as out:
        Path(out.name).write_bytes(package.stored_form())
        location = storage.get_store(settings).put(STORE_FOLDER, f"{sha256}.json", Path(out.name))
    existing = find_by_sha256(session, owner, sha256)
    if existing is not None:
        existing.location = location
        session.commit()
        return existing, False
    row = CodeUpload(
        id=new_id(),
        owner_id=owner.id,
        name=name,
        files=[{"name": n, "size_bytes": len(text.encode())} for n, text in sorted(package.files.items())],
        entrypoints=package.entrypoints,
        bytes=len(package.stored_form()),
        sha256=sha256,
        location=location,
        created_at=utcnow(),
    )
    session.add(row)
    try:
        session.commit()
    except IntegrityError:  # the same key stored the same content a moment ago
        session.rollback()
        earlier = find_by_sha256(session, owner, sha256)
        assert earlier is not None
        return earlier, False
    return row, True


def find_by_sha256(session: Session, owner: Caller, sha256: str) -> CodeUpload | None:
    query = select(CodeUpload).where(CodeUpload.owner_id == owner.id, CodeUpload.sha256 == sha256)
    return session.scalars(query).first()


def find(session: Session, owner: Caller, code_id: str) -> CodeUpload | None:
    """The record `code_id` names if `owner` may see it (its own; an admin key any): the whole id,
    or `code_` and at least 8 of its hex digits when exactly one record starts with them."""
    if SHORT_ID.fullmatch(code_id):
        query = select(CodeUpload).where(CodeUpload.id.startswith(code_id, autoescape=True)).limit(2)
        if not owner.is_admin:
            query = query.where(CodeUpload.owner_id == owner.id)
        found = list(session.scalars(query))
        return found[0] if len(found) == 1 else None
    row = session.get(CodeUpload, code_id)
    return row if row is not None and (row.owner_id == owner.id or owner.is_admin) else None


def owned(session: Session, owner: Caller, limit: int, cursor: str | None) -> tuple[list[CodeUpload], str | None]:
    """The key's code, newest first: a page of `limit` after `cursor`, and the next page's cursor
    (app.pages). Raises ValueError for a cursor this API did not hand out."""
    return pages.page(session, select(CodeUpload).where(CodeUpload.owner_id == owner.id), CodeUpload, limit, cursor)


def delete(session: Session, row: CodeUpload, settings: Settings) -> None:
    """Delete the record; the stored files too when no other record shares them. Raises InUse
    while queued or running jobs or a running sweep train it."""
    uploads.delete(session, row, Job.code_id, lambda base: (base.get("model") or {}).get("code") == row.id, settings)


def render(row: CodeUpload) -> dict[str, Any]:
    """The HTTP form of a record."""
    return {
        "id": row.id,
        "name": row.name,
        "files": row.files,
        "entrypoints": row.entrypoints,
        "bytes": row.bytes,
        "sha256": row.sha256,
        "created_at": rfc3339(row.created_at),
        "owner": row.owner_id,
    }


# --- a job's code -----------------------------------------------------------------------------


def check_job(session: Session, owner: Caller, spec: TrainingSpec, framework: str | None, settings: Settings) -> None:
    """For a spec whose model is user code: 403 unless the deployment and key allow it; 422 (loc
    body.model.<field>) when the code is not the key's, an entrypoint is not one of its top-level
    functions, or it builds for another framework than its job's (as far as its source says). A
    comparison (`framework` None) names one entrypoint per framework in model.entrypoints."""
    model = spec.model
    if model.code is None:
        return
    check_allowed(owner, settings)
    row = find(session, owner, model.code)
    if row is None or row.owner_id != owner.id:
        _invalid("code", f"code {model.code} not found: GET /code lists the code this key uploaded")
    assert row is not None
    if model.entrypoints is not None:
        for fw, entrypoint in model.entrypoints.items():
            _check_entrypoint(row, entrypoint, fw, ["entrypoints", fw])
    else:
        assert model.entrypoint is not None  # the spec pairs code with one of them
        _check_entrypoint(row, model.entrypoint, framework, ["entrypoint"])


def _check_entrypoint(row: CodeUpload, entrypoint: str, framework: str | None, loc: list[str]) -> None:
    if entrypoint not in row.entrypoints:
        listed = ", ".join(sorted(row.entrypoints)[:20]) or "none"
        _invalid(loc, f"code {row.id} has no top-level function {entrypoint!r} (module:function); it has: {listed}")
    builds = row.entrypoints[entrypoint]
    if framework is not None and builds is not None and builds != framework:
        where = "the job's framework" if loc == ["entrypoint"] else "this entrypoint's framework"
        _invalid(
            loc,
            f"{entrypoint} builds a {builds} model (its source uses {builds}'s modules) but {where} is "
            f"{framework}; name a function that builds a {framework} model",
        )


def _invalid(field: str | list[str], message: str) -> None:
    loc = ["body", "model", *([field] if isinstance(field, str) else field)]
    raise RequestValidationError([{"type": "value_error", "loc": loc, "msg": message}])
