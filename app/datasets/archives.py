"""Members of uploaded zip and tar archives, and gzip streams, read into memory with caps.

A small upload can unpack to terabytes (a zip bomb), so every decompressed byte is counted
against one `Budget` per upload, declared sizes are checked before anything is read, and reads
stop as soon as the budget is spent. Member names are only ever compared as strings: nothing
is extracted to disk, so a name like "../../etc/passwd" cannot become a path; still such a
member (absolute, or with a ".." part) is refused by name rather than read or skipped, as it
says the archive was not made from inside its folder.
"""

from __future__ import annotations

import gzip
import io
import re
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from app.datasets.common import FILES, UNPACKED, DatasetRejected, UploadLimits, check_limit, shown

CHUNK = 1 << 20  # bytes per read: small enough that a cap overshoots by at most this much
TAR_BUFFER = 64 << 10  # bytes: a few of tarfile's 10 KiB records
GZIP_MAGIC = b"\x1f\x8b"
BOMB_FIX = "upload fewer or smaller files (an archive that unpacks this large may be a zip bomb)"
# Errors the standard library raises for damaged or cut-off archives and streams.
READ_ERRORS = (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, zlib.error, NotImplementedError)
_DRIVE = re.compile(r"[A-Za-z]:")  # C: — a Windows absolute path


class Readable(Protocol):
    """What is read here: a file, a gzip stream, a zip member."""

    def read(self, size: int, /) -> bytes: ...


class Budget:
    """Decompressed bytes an upload may still produce, out of `limit`."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.left = limit

    def take(self, count: int, where: str) -> None:
        """Count `count` more bytes produced at `where`; 413 once the total is over the limit."""
        self.left -= count
        if self.left < 0:
            raise DatasetRejected(
                f"{where}: the upload unpacks to more than the limit of {self.limit:,} bytes ({UNPACKED}); {BOMB_FIX}",
                where,
                413,
            )


def read_capped(stream: Readable, budget: Budget, where: str) -> bytes:
    """All of `stream`, chunk by chunk, each chunk counted against `budget`."""
    parts = []
    while chunk := stream.read(CHUNK):
        budget.take(len(chunk), where)
        parts.append(chunk)
    return b"".join(parts)


def gunzip(data: bytes, budget: Budget, where: str) -> bytes:
    """`data` decompressed when it is gzip (by its magic bytes), else `data` itself.
    gzip.decompress would allocate whatever the stream claims; this stops at the budget."""
    if data[:2] != GZIP_MAGIC:
        return data
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as stream:
            return read_capped(stream, budget, where)
    except (EOFError, OSError, zlib.error) as exc:  # gzip.BadGzipFile is an OSError
        raise DatasetRejected(f"{where}: a damaged or cut-off gzip stream ({exc}); upload it again", where) from exc


def is_junk(name: str) -> bool:
    """Files that archivers add and nobody means as data: macOS's __MACOSX/ and dot files."""
    return any(part.startswith(".") or part == "__MACOSX" for part in name.split("/") if part)


def check_member_name(name: str) -> None:
    """422 for a member whose path leads outside the archive: absolute ("/x", "C:/x") or with
    a ".." part ("../../x", "a/../../x"), with either kind of slash."""
    parts = name.replace("\\", "/").split("/")
    if name.startswith(("/", "\\")) or _DRIVE.match(name) or ".." in parts:
        raise DatasetRejected(
            f"member {shown(name, 200)} has a path outside the archive (absolute, or with a '..' part); "
            "make the archive from inside the dataset's folder, so every member's path is relative to it",
            name,
        )


def zip_files(archive: zipfile.ZipFile, limits: UploadLimits) -> list[zipfile.ZipInfo]:
    """The file members of `archive` (no folders), after checking from the central directory,
    before any read, the member count and names and the declared unpacked size against the limits."""
    infos = archive.infolist()
    check_limit(len(infos), limits.max_files, "members", "archive", "upload fewer files", FILES)
    for info in infos:
        check_member_name(info.filename)
    files = [info for info in infos if not info.is_dir()]
    declared = sum(info.file_size for info in files)
    check_limit(declared, limits.max_unpacked_bytes, "bytes when unpacked", "archive", BOMB_FIX, UNPACKED)
    for info in files:
        if info.flag_bits & 0x1:
            message = f"{info.filename}: encrypted members are not supported; zip it without a password"
            raise DatasetRejected(message, info.filename)
    return files


def read_zip_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, budget: Budget) -> bytes:
    """One member's bytes, capped by `budget` whatever its header declared."""
    try:
        with archive.open(info) as stream:
            return read_capped(stream, budget, info.filename)
    except READ_ERRORS as exc:
        raise DatasetRejected(
            f"{info.filename}: the member is damaged ({exc}); make the archive again", info.filename
        ) from exc


def open_zip(path: Path) -> zipfile.ZipFile:
    """`path` as a zip archive; 422 when it is not one or its directory is damaged."""
    try:
        return zipfile.ZipFile(path)
    except READ_ERRORS as exc:
        raise DatasetRejected(f"not a readable zip archive ({exc}); make the archive again", "archive") from exc


class _Counted(io.RawIOBase):
    """A read-only stream that counts what it passes on against a budget (the tar's stream of
    decompressed bytes: tarfile reads it through, whatever the member headers say)."""

    def __init__(self, raw: Readable, budget: Budget) -> None:
        self._raw = raw
        self._budget = budget

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self._raw.read(len(view))
        self._budget.take(len(data), "archive")
        view[: len(data)] = data
        return len(data)


def tar_files(path: Path, wanted: Callable[[str], bool], limits: UploadLimits, budget: Budget) -> dict[str, bytes]:
    """The bytes of the regular-file members of a tar (plain or gzip) whose name `wanted`
    accepts, read as a stream in one pass. Links, devices and FIFOs are refused: a link could
    point a name at another member or outside the archive."""
    with open(path, "rb") as raw:
        compressed = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        source: Readable = gzip.GzipFile(fileobj=raw) if compressed else raw
        # A small buffer: what it reads ahead is counted before tarfile sees it, so a member
        # declared over the budget is still named as the culprit.
        stream = io.BufferedReader(_Counted(source, budget), TAR_BUFFER)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as archive:
                return _read_tar(archive, wanted, limits, budget)
        except READ_ERRORS as exc:
            raise DatasetRejected(f"not a readable tar archive ({exc}); make the archive again", "archive") from exc


def _read_tar(
    archive: tarfile.TarFile, wanted: Callable[[str], bool], limits: UploadLimits, budget: Budget
) -> dict[str, bytes]:
    found: dict[str, bytes] = {}
    for count, member in enumerate(archive, start=1):
        check_limit(count, limits.max_files, "members", "archive", "upload fewer files", FILES)
        check_member_name(member.name)
        if member.isdir():
            continue
        if not member.isfile():
            kind = "a link" if member.issym() or member.islnk() else "not a regular file"
            raise DatasetRejected(
                f"{member.name}: the member is {kind}; only regular files and folders are allowed, "
                "so archive the files themselves (tar without links)",
                member.name,
            )
        if member.size > budget.left:
            budget.take(member.size, member.name)  # declared over what is left: refuse before reading
        if wanted(member.name) and not is_junk(member.name):
            extracted = archive.extractfile(member)  # its bytes are counted as the stream passes them
            found[member.name] = extracted.read() if extracted else b""
    return found
