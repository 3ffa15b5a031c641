"""Where artifacts live: a local directory (the default) or an S3-compatible object store.

A worker trains into a scratch folder, then `put`s each file the trainer wrote into the store and
records the location `put` returns in `artifacts.path`: a filesystem path for the local store,
`s3://<bucket>/<key>` for S3. Readers (the API's download route, the comparison check) go by
that recorded location, not by the current setting, so files stored before a change of store
still download.

The local store needs the API and every worker to share `artifact_dir` (one host, or a network
filesystem); with S3 (MinIO, Ceph, AWS...) workers on other hosts need only the bucket.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from app.config import Settings, get_settings
from trainers.base import remove_checkpoint

log = logging.getLogger(__name__)

S3_SCHEME = "s3://"
CHUNK_BYTES = 1 << 20
S3_DELETE_BATCH = 1000  # the most keys S3's DeleteObjects takes in one request


class ArtifactMissing(Exception):
    """The recorded location holds no file (deleted, or outside the artifact dir)."""


class StoreUnavailable(Exception):
    """The store cannot be written: a missing bucket, wrong credentials, an unwritable folder."""


@dataclass(frozen=True)
class ByteRange:
    """Bytes `start`..`end` of a file of `size` bytes, both ends included (HTTP's convention)."""

    start: int
    end: int
    size: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1


class ArtifactStore(Protocol):
    kind: str

    def put(self, job_id: str, name: str, source: Path) -> str:
        """Store the file `source` as artifact `name` of `job_id`; return its location."""

    def check(self) -> None:
        """Raise StoreUnavailable when the store cannot be written."""


class LocalStore:
    """Files under `root/<job id>/<name>`; the trainer already writes them there, so `put` copies
    only a file that lies elsewhere."""

    kind = "local"

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def put(self, job_id: str, name: str, source: Path) -> str:
        target = self.root / job_id / name
        if source.resolve() != target:
            target.parent.mkdir(parents=True, exist_ok=True)
            partial = target.with_name(f".{name}.partial")
            shutil.copyfile(source, partial)
            os.replace(partial, target)  # readers never see half a file
        return str(target)

    def check(self) -> None:
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailable(f"cannot create the artifact dir {self.root}: {exc}") from exc
        if not os.access(self.root, os.W_OK):
            raise StoreUnavailable(f"the artifact dir {self.root} is not writable")

    def path(self, location: str) -> Path:
        """The file at `location`; ArtifactMissing unless it is a file under the root."""
        path = Path(location).resolve()
        if not path.is_relative_to(self.root) or not path.is_file():
            raise ArtifactMissing(location)
        return path

    def read_bytes(self, location: str) -> bytes:
        return self.path(location).read_bytes()

    def delete(self, location: str) -> None:
        """Remove the file at `location` (nothing when there is none)."""
        try:
            self.path(location).unlink(missing_ok=True)
        except ArtifactMissing:
            pass

    def size(self, location: str) -> int:
        return self.path(location).stat().st_size

    def stream(self, location: str, byte_range: ByteRange | None = None) -> Iterator[bytes]:
        """The file's bytes (or `byte_range` of them) in chunks of CHUNK_BYTES."""
        with open(self.path(location), "rb") as f:
            remaining = byte_range.length if byte_range else None
            if byte_range:
                f.seek(byte_range.start)
            while remaining is None or remaining > 0:
                chunk = f.read(CHUNK_BYTES if remaining is None else min(CHUNK_BYTES, remaining))
                if not chunk:
                    return
                if remaining is not None:
                    remaining -= len(chunk)
                yield chunk


class S3Store:
    """Objects `s3://<bucket>/<prefix><job id>/<name>` in an S3-compatible store."""

    kind = "s3"

    def __init__(self, bucket: str, prefix: str, client: Any) -> None:  # client: a boto3 S3 client
        self.bucket = bucket
        self.prefix = prefix
        self.client = client

    def put(self, job_id: str, name: str, source: Path) -> str:
        key = f"{self.prefix}{job_id}/{name}"
        self.client.upload_file(str(source), self.bucket, key)  # multipart for large weights
        return f"{S3_SCHEME}{self.bucket}/{key}"

    def check(self) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self.client.head_bucket(Bucket=self.bucket)
        except (BotoCoreError, ClientError) as exc:
            raise StoreUnavailable(f"cannot reach bucket {self.bucket!r}: {exc}") from exc

    def size(self, location: str) -> int:
        """The object's size in bytes. Raises ArtifactMissing when there is none, StoreUnavailable
        when the store does not answer."""
        from botocore.exceptions import BotoCoreError, ClientError

        bucket, key = split_s3(location)
        try:
            return self.client.head_object(Bucket=bucket, Key=key)["ContentLength"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound", "NoSuchBucket"):
                raise ArtifactMissing(location) from exc
            raise StoreUnavailable(f"{location}: {exc}") from exc
        except BotoCoreError as exc:  # the store is unreachable
            raise StoreUnavailable(f"{location}: {exc}") from exc

    def read_bytes(self, location: str) -> bytes:
        return b"".join(self.stream(location))

    def delete(self, location: str) -> None:
        """Remove the object at `location` (S3 answers success when there is none)."""
        bucket, key = split_s3(location)
        self.client.delete_object(Bucket=bucket, Key=key)

    def delete_many(self, locations: Sequence[str]) -> None:
        """Remove the objects at `locations` (all in this store's bucket), S3_DELETE_BATCH per
        request; ones already gone are fine. Raises StoreUnavailable when the store does not
        answer or refuses to delete one."""
        from botocore.exceptions import BotoCoreError, ClientError

        keys = [split_s3(location)[1] for location in locations]
        for start in range(0, len(keys), S3_DELETE_BATCH):
            objects = [{"Key": key} for key in keys[start : start + S3_DELETE_BATCH]]
            try:
                answer = self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": objects, "Quiet": True})
            except (BotoCoreError, ClientError) as exc:
                raise StoreUnavailable(f"cannot delete from bucket {self.bucket!r}: {exc}") from exc
            if errors := answer.get("Errors"):
                first = errors[0]
                raise StoreUnavailable(
                    f"bucket {self.bucket!r} kept {len(errors)} objects, e.g. {first.get('Key')!r}: "
                    f"{first.get('Code')} {first.get('Message')}"
                )

    def stream(self, location: str, byte_range: ByteRange | None = None) -> Iterator[bytes]:
        """The object's bytes (or `byte_range` of them) in chunks of CHUNK_BYTES."""
        bucket, key = split_s3(location)
        extra = {"Range": f"bytes={byte_range.start}-{byte_range.end}"} if byte_range else {}
        try:
            body = self.client.get_object(Bucket=bucket, Key=key, **extra)["Body"]
        except self.client.exceptions.NoSuchKey as exc:
            raise ArtifactMissing(location) from exc
        try:
            yield from body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()


def split_s3(location: str) -> tuple[str, str]:
    """`s3://bucket/key` -> (bucket, key)."""
    bucket, _, key = location.removeprefix(S3_SCHEME).partition("/")
    return bucket, key


def is_s3(location: str) -> bool:
    return location.startswith(S3_SCHEME)


@lru_cache
def _s3_client(endpoint_url: str | None, region: str | None, access_key_id: str | None, secret: str | None) -> Any:
    import boto3
    from botocore.config import Config

    # Path-style addressing: MinIO and servers on an IP address have no per-bucket host names.
    config = Config(
        s3={"addressing_style": "path"} if endpoint_url else {},
        retries={"max_attempts": 5, "mode": "standard"},
        connect_timeout=5,
        read_timeout=60,
    )
    return boto3.client(
        "s3",
        endpoint_url=endpoint_url,
        region_name=region,
        aws_access_key_id=access_key_id,
        aws_secret_access_key=secret,
        config=config,
    )


def s3_client(settings: Settings) -> Any:
    """A boto3 S3 client for the settings (one per distinct configuration; they are thread-safe).
    Empty values (as compose passes unset variables) count as unset."""
    secret = settings.s3_secret_access_key.get_secret_value() if settings.s3_secret_access_key else None
    return _s3_client(
        settings.s3_endpoint_url or None, settings.s3_region or None, settings.s3_access_key_id or None, secret or None
    )


def get_store(settings: Settings | None = None) -> LocalStore | S3Store:
    """The store new artifacts go to, as Settings.artifact_store says."""
    settings = settings or get_settings()
    if settings.artifact_store == "s3":
        assert settings.s3_bucket, "Settings requires s3_bucket with artifact_store s3"
        return S3Store(settings.s3_bucket, settings.s3_prefix, s3_client(settings))
    return LocalStore(settings.resolved_artifact_dir())


def store_for(location: str, settings: Settings | None = None) -> LocalStore | S3Store:
    """The store that holds the artifact recorded at `location` (the bucket in the location wins)."""
    settings = settings or get_settings()
    if is_s3(location):
        return S3Store(split_s3(location)[0], settings.s3_prefix, s3_client(settings))
    return LocalStore(settings.resolved_artifact_dir())


def read_bytes(location: str) -> bytes:
    """The whole artifact at `location`. Raises ArtifactMissing."""
    return store_for(location).read_bytes(location)


class Unsatisfiable(Exception):
    """No range of a Range header lies within the file: HTTP 416 with `Content-Range: bytes */SIZE`."""


_RANGE_SPEC = re.compile(r"(\d*)-(\d*)")
# Beyond any file's size; longer digit strings are not converted (int() of huge strings is slow).
_HUGE = 10**18


def _position(digits: str) -> int:
    return int(digits) if len(digits) <= 18 else _HUGE


def parse_range(header: str | None, size: int) -> ByteRange | None:
    """The byte range a `Range` header asks of a file of `size` bytes, by RFC 9110 section 14.

    None to send the whole file (200): no header, a unit other than `bytes`, a header that is
    not valid range syntax (`bytes=abc`, `bytes=5-4`), or several satisfiable ranges (a server
    may answer those with the whole file). Raises Unsatisfiable (416) when the header is valid
    but none of its ranges lies within the file (`bytes=SIZE-`, `bytes=-0`)."""
    if header is None:
        return None
    unit, equals, range_set = header.partition("=")
    if not equals or unit.strip().lower() != "bytes":
        return None
    specs = [spec.strip() for spec in range_set.split(",") if spec.strip()]
    parsed = []
    for spec in specs:
        match = _RANGE_SPEC.fullmatch(spec)
        if match is None or match[0] == "-":
            return None
        first, last = match[1], match[2]
        if first and last and _position(last) < _position(first):
            return None
        parsed.append((first, last))
    if not parsed:
        return None
    satisfiable = []
    for first, last in parsed:
        if not first:  # the last N bytes
            if _position(last) > 0 and size > 0:
                satisfiable.append(ByteRange(max(0, size - _position(last)), size - 1, size))
        elif _position(first) < size:
            end = min(_position(last), size - 1) if last else size - 1
            satisfiable.append(ByteRange(_position(first), end, size))
    if not satisfiable:
        if size == 0 and any(not first for first, _ in parsed):
            return None  # a suffix range of an empty file: the (empty) whole
        raise Unsatisfiable(f"no range of {header[:100]!r} lies within the {size} bytes")
    return satisfiable[0] if len(satisfiable) == 1 else None


def drop_checkpoint(job_id: str) -> None:
    """Delete an ended job's checkpoint from its folder of the artifact dir, where its worker
    wrote it (trainers.base.remove_checkpoint): an ended job never resumes, and the folder is
    otherwise kept until the job's retention. A file that cannot be removed is logged and left
    for retention. The folder goes too when nothing else is in it (the job wrote no artifact)."""
    workdir = get_settings().resolved_artifact_dir() / job_id
    try:
        remove_checkpoint(workdir)
    except OSError as exc:
        log.warning("job %s: its checkpoint could not be removed: %s", job_id, exc)
    with contextlib.suppress(OSError):  # not empty, or not there: left as it is
        workdir.rmdir()
