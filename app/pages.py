"""Keyset pages of a list, newest first: jobs, datasets, code, sweeps and comparisons are listed
`limit` at a time, and each page but the last hands back `next_cursor`, which the client passes
as `cursor` for the next. A cursor is the (created_at, id) of the page's last row, so a page
costs one index range whatever the list's length, and rows created meanwhile never shift the
pages after it."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import datetime
from typing import Any, TypeVar

from sqlalchemy import Select, and_, or_
from sqlalchemy.orm import Session

Row = TypeVar("Row")

# The ids a cursor may name: UUIDs and the prefixed ids (ds_..., code_...); never a NUL, which
# PostgreSQL refuses in a string (a 500 otherwise).
_ID = re.compile(r"[0-9A-Za-z_-]{1,40}")
CURSOR_HELP = "cursor is not one this API returned; pass next_cursor unchanged"


def page(
    session: Session, query: Select[Row], model: Any, limit: int, cursor: str | None
) -> tuple[list[Row], str | None]:
    """The rows of `query` (selecting `model`, which has created_at and id) newest first, at most
    `limit`, after `cursor`; and the cursor of the next page (None on the last).

    Raises ValueError (CURSOR_HELP) for a cursor this API did not hand out."""
    if cursor:
        created_at, row_id = decode(cursor)
        query = query.where(or_(model.created_at < created_at, and_(model.created_at == created_at, model.id < row_id)))
    rows = list(session.scalars(query.order_by(model.created_at.desc(), model.id.desc()).limit(limit + 1)))
    found, more = rows[:limit], len(rows) > limit
    return found, encode(found[-1]) if more else None


def encode(row: Any) -> str:
    return base64.urlsafe_b64encode(f"{row.created_at.isoformat()}|{row.id}".encode()).decode()


def decode(cursor: str) -> tuple[datetime, str]:
    try:
        created_at, row_id = base64.urlsafe_b64decode(cursor.encode()).decode().split("|", 1)
        if not _ID.fullmatch(row_id):
            raise ValueError(row_id)
        return datetime.fromisoformat(created_at), row_id
    except (ValueError, binascii.Error, UnicodeDecodeError) as exc:
        raise ValueError(CURSOR_HELP) from exc
