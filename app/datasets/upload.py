"""Receiving an upload: the request body streamed to a temporary file and hashed as it arrives.

The body is either the file itself (its Content-Type, e.g. `text/csv`) or `multipart/form-data`
with one file part and optional text fields (the same options as the query parameters). Either
way the API holds one network chunk at a time, never the upload.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

if TYPE_CHECKING:  # a TypedDict the module defines for type checkers only
    from python_multipart.multipart import MultipartCallbacks

MAX_FIELDS = 16  # text fields of a multipart body
MAX_FIELD_BYTES = 1000
MULTIPART_OVERHEAD = 64 * 1024  # boundaries and part headers on top of the file's own bytes

# A file's Content-Type, for a raw body without a filename: the extension format detection reads.
CONTENT_TYPE_SUFFIXES = {
    "text/csv": ".csv",
    "application/vnd.apache.parquet": ".parquet",
    "application/x-parquet": ".parquet",
    "application/x-npz": ".npz",
}


class UploadTooLarge(Exception):
    """The body passed the limit (413); `limit` in bytes."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


class BadUpload(Exception):
    """The body is not one file (no file part, two of them, a malformed multipart body): 400."""


@dataclass
class Received:
    """An upload on disk: `path` (a temporary file the caller deletes), its `size` in bytes and
    `sha256`, the client's `filename` (only its extension is ever used) and the text `fields`."""

    path: Path
    size: int = 0
    sha256: str = ""
    filename: str | None = None
    fields: dict[str, str] = field(default_factory=dict)


async def receive(request: Request, directory: Path, max_bytes: int) -> Received:
    """Stream the request's body into a new temporary file under `directory`. Raises
    UploadTooLarge past `max_bytes` of file (before reading when Content-Length says so),
    BadUpload for a body that is not one file; the temporary file is removed on any error."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes + MULTIPART_OVERHEAD:
        raise UploadTooLarge(max_bytes)
    directory.mkdir(parents=True, exist_ok=True)
    handle, name = tempfile.mkstemp(dir=directory, prefix=".upload-")
    received = Received(Path(name))
    try:
        with os.fdopen(handle, "wb") as file:
            content_type, options = parse_options_header(request.headers.get("content-type", ""))
            if content_type == b"multipart/form-data":
                await _multipart(request, file, received, options.get(b"boundary", b""), max_bytes)
            else:
                await _raw(request, file, received, max_bytes)
                received.filename = CONTENT_TYPE_SUFFIXES.get(content_type.decode("latin-1").lower())
    except BaseException:
        received.path.unlink(missing_ok=True)
        raise
    return received


async def _raw(request: Request, file: BinaryIO, received: Received, max_bytes: int) -> None:
    digest = hashlib.sha256()
    async for chunk in request.stream():
        received.size += len(chunk)
        if received.size > max_bytes:
            raise UploadTooLarge(max_bytes)
        digest.update(chunk)
        file.write(chunk)
    received.sha256 = digest.hexdigest()
    if received.size == 0:
        raise BadUpload("the request body is empty: send the dataset file as the body, or as a multipart file part")


class _Parts:
    """python-multipart's callbacks: the one file part goes to `file` (hashed), text parts to
    `received.fields`."""

    def __init__(self, file: BinaryIO, received: Received, max_bytes: int) -> None:
        self.file, self.received, self.max_bytes = file, received, max_bytes
        self.digest = hashlib.sha256()
        self.header_name, self.header_value = b"", b""
        self.disposition: dict[bytes, bytes] = {}
        self.value = bytearray()
        self.files = 0

    def callbacks(self) -> MultipartCallbacks:
        return {
            "on_part_begin": self.part_begin,
            "on_header_field": lambda data, start, end: self._append_header("header_name", data[start:end]),
            "on_header_value": lambda data, start, end: self._append_header("header_value", data[start:end]),
            "on_header_end": self.header_end,
            "on_part_data": self.part_data,
            "on_part_end": self.part_end,
        }

    def _append_header(self, which: str, data: bytes) -> None:
        setattr(self, which, getattr(self, which) + data)
        if len(getattr(self, which)) > MAX_FIELD_BYTES:
            raise BadUpload("a multipart part header is too long")

    def part_begin(self) -> None:
        self.disposition, self.value = {}, bytearray()

    def header_end(self) -> None:
        if self.header_name.strip().lower() == b"content-disposition":
            _, self.disposition = parse_options_header(self.header_value)
        self.header_name, self.header_value = b"", b""

    def is_file(self) -> bool:
        return b"filename" in self.disposition

    def part_data(self, data: bytes, start: int, end: int) -> None:
        chunk = data[start:end]
        if not self.is_file():
            self.value += chunk
            if len(self.value) > MAX_FIELD_BYTES:
                raise BadUpload(f"form field {self._name()!r} is longer than {MAX_FIELD_BYTES} bytes")
            return
        self.received.size += len(chunk)
        if self.received.size > self.max_bytes:
            raise UploadTooLarge(self.max_bytes)
        self.digest.update(chunk)
        self.file.write(chunk)

    def part_end(self) -> None:
        if self.is_file():
            self.files += 1
            if self.files > 1:
                raise BadUpload("the multipart body has more than one file part: upload one dataset file at a time")
            self.received.filename = self.disposition[b"filename"].decode("utf-8", "replace")
            return
        if len(self.received.fields) >= MAX_FIELDS:
            raise BadUpload(f"the multipart body has more than {MAX_FIELDS} form fields")
        self.received.fields[self._name()] = self.value.decode("utf-8", "replace")

    def _name(self) -> str:
        return self.disposition.get(b"name", b"").decode("utf-8", "replace")[:100]


async def _multipart(request: Request, file: BinaryIO, received: Received, boundary: bytes, max_bytes: int) -> None:
    if not boundary:
        raise BadUpload("multipart/form-data needs a boundary in its Content-Type")
    parts = _Parts(file, received, max_bytes)
    parser = MultipartParser(boundary, parts.callbacks())
    try:
        async for chunk in request.stream():
            parser.write(chunk)
        parser.finalize()
    except (UploadTooLarge, BadUpload):
        raise
    except Exception as exc:  # python-multipart's MultipartParseError and the like
        raise BadUpload(f"the multipart body is malformed: {exc}") from None
    if parts.files == 0:
        raise BadUpload("the multipart body has no file part: send the dataset as a part with a filename")
    if received.size == 0:
        raise BadUpload("the uploaded file is empty")
    received.sha256 = parts.digest.hexdigest()
