"""A worker's local cache of uploaded datasets, keyed by their sha256.

Datasets are stored content-addressed in the artifact store; before a job trains on one, its worker
`fetch`es it into `cache_dir/<sha256>.safetensors`. The digest is checked after every download, so a
file in the cache is trusted on later hits without hashing it again. The cache is bounded by
`max_bytes` and evicts the least recently used files (oldest mtime; a hit touches the file).

Several worker processes on one host share the cache dir without locks: a download goes to a
uniquely named `.partial-*` file and is moved into place with one atomic rename, so nobody sees
half a file, and two processes fetching the same dataset at once both end with a complete one
(the second rename swaps in identical bytes; a reader of the first keeps its open file).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from app.config import get_settings
from app.datasets import records
from app.db import retrying, session_scope
from app.storage import ArtifactMissing, store_for
from trainers.data import DataNotFound
from trainers.spec import TrainingSpec

log = logging.getLogger(__name__)

SUFFIX = ".safetensors"
MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors' own limit on a header
PARTIAL_PREFIX = ".partial-"
# A download writes its partial file chunk by chunk, refreshing its mtime; one untouched this long
# was left by a process that died mid-download.
STALE_PARTIAL_SECONDS = 3600.0
_SHA256 = re.compile(r"[0-9a-f]{64}")

OpenStream = Callable[[str], Iterator[bytes]]


@dataclass
class Fetched:
    """A dataset in the cache: `path` is complete and verified; `hit` is True when it was already
    cached; `seconds` is the wall time of the lookup, download and hash check."""

    path: Path
    hit: bool
    seconds: float


class DatasetCorrupt(Exception):
    """The bytes downloaded from `location` do not hash to the expected sha256, twice in a row.

    `str()` is for the job's user (no server paths); `detail` for the worker's log."""

    def __init__(self, location: str, expected: str, got: str) -> None:
        super().__init__(
            f"the stored copy of the dataset (sha256 {expected}) is damaged: it hashes to {got}; "
            "upload the dataset again (the service's operators find the details in the worker's log)"
        )
        self.detail = f"dataset at {location}: expected sha256 {expected}, got {got} (after one retry)"
        self.location = location
        self.expected = expected
        self.got = got


def fetch(
    sha256: str, location: str, cache_dir: Path, max_bytes: int, open_stream: OpenStream | None = None
) -> Fetched:
    """The dataset `sha256` as a file in `cache_dir`, downloaded from `location` on a miss.

    `open_stream(location)` yields the stored bytes in chunks (default: the artifact store that
    holds `location`). `max_bytes` bounds the total size of the cached datasets, in bytes; the file
    just fetched is kept even when it alone is larger (a warning is logged). `cache_dir` is created
    if missing.

    Raises ValueError when `sha256` is not 64 lowercase hex digits (it becomes a file name),
    DatasetCorrupt when two downloads in a row hash to something else, and whatever the stream
    raises (app.storage's ArtifactMissing, StoreUnavailable), leaving no partial file behind.

    Another process sharing the cache may evict the file after this returns (only when later
    fetches overflow `max_bytes`, as it is the newest); open it promptly.
    """
    if not _SHA256.fullmatch(sha256):
        raise ValueError(f"sha256 must be 64 lowercase hex digits, got {sha256!r}")
    start = time.perf_counter()
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / f"{sha256}{SUFFIX}"
    if _touch(target) and _intact(target):
        return Fetched(path=target, hit=True, seconds=time.perf_counter() - start)

    opener = open_stream or _store_stream
    for attempt in (1, 2):
        partial, got = _download(opener, location, cache_dir)
        if got == sha256:
            os.replace(partial, target)
            break
        partial.unlink(missing_ok=True)
        if attempt == 2:
            raise DatasetCorrupt(location, sha256, got)
        log.warning("dataset at %s hashed to %s, expected %s; downloading it again", location, got, sha256)

    _evict(cache_dir, max_bytes, keep=target)
    _remove_stale_partials(cache_dir)
    return Fetched(path=target, hit=False, seconds=time.perf_counter() - start)


def _store_stream(location: str) -> Iterator[bytes]:
    return store_for(location).stream(location)


def _touch(path: Path) -> bool:
    """Mark `path` as just used (its mtime orders eviction); False when it is not there."""
    try:
        os.utime(path)
    except FileNotFoundError:  # not cached, or just evicted by another process: a miss either way
        return False
    return True


def _intact(path: Path) -> bool:
    """Whether a cached file is still whole: its safetensors header parses and the file is as long
    as the header says. (Hashing every hit would cost seconds a gigabyte; a damaged entry is
    removed here and downloaded again, its hash then checked.)"""
    try:
        with open(path, "rb") as f:
            header_size = int.from_bytes(f.read(8), "little")
            if header_size > MAX_HEADER_BYTES:
                raise ValueError("header too large")
            header = json.loads(f.read(header_size))
        end = max((entry["data_offsets"][1] for name, entry in header.items() if name != "__metadata__"), default=0)
        if path.stat().st_size == 8 + header_size + end:
            return True
    except (OSError, ValueError, KeyError, TypeError, IndexError):
        pass
    log.warning("cached dataset %s is damaged; fetching it again", path.name)
    path.unlink(missing_ok=True)
    return False


def _download(opener: OpenStream, location: str, cache_dir: Path) -> tuple[Path, str]:
    """Stream `location` into a new partial file in `cache_dir`; return it and its sha256 hex digest.
    On any error the partial file is removed and the error raised."""
    digest = hashlib.sha256()
    with tempfile.NamedTemporaryFile(dir=cache_dir, prefix=PARTIAL_PREFIX, delete=False) as f:
        partial = Path(f.name)
        try:
            for chunk in opener(location):
                f.write(chunk)
                digest.update(chunk)
            f.flush()
            # Hits are not re-hashed, so the bytes must be on disk before the rename makes them a
            # cache entry: otherwise a crash could leave a truncated file under a valid name.
            os.fsync(f.fileno())
        except BaseException:
            partial.unlink(missing_ok=True)  # while still open: fine on POSIX
            raise
    return partial, digest.hexdigest()


def _evict(cache_dir: Path, max_bytes: int, keep: Path) -> None:
    """Delete the least recently used datasets until they total at most `max_bytes`, never `keep`.

    Files another process is reading may go: on POSIX its open descriptor stays valid."""
    entries: list[tuple[int, str, Path, int]] = []
    for path in cache_dir.glob(f"*{SUFFIX}"):
        try:
            stat = path.stat()
        except FileNotFoundError:  # evicted by another process meanwhile
            continue
        entries.append((stat.st_mtime_ns, path.name, path, stat.st_size))
    total = sum(size for *_, size in entries)
    for _, _, path, size in sorted(entries):  # oldest first; the name breaks ties, for a fixed order
        if total <= max_bytes:
            break
        if path == keep:
            continue
        try:
            path.unlink()
            log.info("evicted dataset %s (%d bytes) from the cache", path.name, size)
        except FileNotFoundError:  # another process evicted it first; it is gone all the same
            pass
        total -= size
    if total > max_bytes:
        log.warning("dataset %s alone exceeds the cache limit: %d bytes cached, max %d", keep.name, total, max_bytes)


def _remove_stale_partials(cache_dir: Path) -> None:
    """Delete partial downloads untouched for STALE_PARTIAL_SECONDS (their process died)."""
    cutoff = time.time() - STALE_PARTIAL_SECONDS
    for path in cache_dir.glob(f"{PARTIAL_PREFIX}*"):
        try:
            if path.stat().st_mtime < cutoff:
                path.unlink()
        except FileNotFoundError:
            pass


def fetch_for(spec: TrainingSpec) -> tuple[Path | None, dict[str, float]]:
    """(the cached file of the job's uploaded dataset, timings {"data_s": seconds to fetch it,
    "data_cache_hit": 1.0 or 0.0}); (None, {}) for a built-in dataset. The job's own record says
    where the data lies; other records of the same content are tried when that copy is missing.
    Raises DataNotFound when no stored copy remains, DatasetCorrupt when the store's copy does not
    hash to the sha256 the job names."""
    info = spec.dataset.info
    if info is None:
        return None, {}
    settings = get_settings()
    locations = retrying(lambda: _locations(spec.dataset.id, info.sha256))
    for location in locations:
        try:
            fetched = fetch(info.sha256, location, settings.resolved_dataset_cache_dir(), settings.dataset_cache_bytes)
        except ArtifactMissing:
            log.warning("dataset %s: no stored copy at %s", info.sha256, location)
            continue
        return fetched.path, {"data_s": fetched.seconds, "data_cache_hit": float(fetched.hit)}
    raise DataNotFound(
        f"dataset {spec.dataset.id} (sha256 {info.sha256}) has no stored copy left; upload it again",
        f"looked in {', '.join(locations) or 'no record'}",
    )


def _locations(dataset_id: str | None, sha256: str) -> list[str]:
    with session_scope() as session:
        return records.locations_of(session, dataset_id, sha256)
