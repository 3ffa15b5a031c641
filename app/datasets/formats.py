"""Uploaded dataset files: which format one is, and reading it into `DatasetArrays`.

The upload has already been streamed to a temporary file; `parse_upload` reads it with the
field's own library (numpy without pickle, pyarrow, Pillow, zipfile/tarfile), validates all of
it once and returns the normalised arrays that `trainers.dataset_file.write` stores. Anything
wrong with the upload is a `DatasetRejected` (422, or 413 for sizes and counts over the
`UploadLimits`), never another exception.

Formats: `npz` (x_train, y_train[, x_test, y_test]), `idx` (MNIST's four IDX files in a .zip
or .tar(.gz)), `csv` and `parquet` (feature columns, a label column, an optional split column),
`imagefolder` (a .zip of train/<class>/<image>[, test/<class>/<image>]).
"""

from __future__ import annotations

import codecs
import gzip
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from app.datasets.archives import GZIP_MAGIC, is_junk, open_zip
from app.datasets.arrays import read_npz
from app.datasets.common import (
    FORMATS,
    TASKS,
    DatasetRejected,
    UploadLimits,
    UploadOptions,
    check_options,
)
from app.datasets.idx import idx_key, read_idx_archive
from app.datasets.images import IMAGE_EXTENSIONS, read_imagefolder
from app.datasets.tables import read_csv, read_parquet
from trainers.dataset_file import DatasetArrays

__all__ = [
    "FORMATS",
    "TASKS",
    "DatasetRejected",
    "UploadLimits",
    "UploadOptions",
    "detect_format",
    "parse_upload",
]

Reader = Callable[[Path, UploadOptions, UploadLimits], DatasetArrays]
READERS: dict[str, Reader] = {
    "npz": read_npz,
    "idx": read_idx_archive,
    "csv": read_csv,
    "parquet": read_parquet,
    "imagefolder": read_imagefolder,
}
# Extensions that name a format on their own (".zip" does not: it may hold any of three).
EXTENSIONS = {
    ".npz": "npz",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
    ".tar": "idx",
    ".tar.gz": "idx",
    ".tgz": "idx",
}
SUPPORTED = (
    "npz (np.savez with x_train, y_train and optionally x_test, y_test), "
    "idx (MNIST's IDX files in a .zip or .tar.gz), csv and parquet (numeric feature columns and a label column), "
    "imagefolder (a .zip of train/<class>/<image>, optionally test/<class>/<image>)"
)
# Bugs of a reader aside, what the libraries raise for input they cannot read.
LIBRARY_ERRORS = (ValueError, OSError, EOFError, zlib.error, zipfile.BadZipFile, tarfile.TarError, NotImplementedError)


def parse_upload(path: Path, options: UploadOptions, limits: UploadLimits = UploadLimits()) -> DatasetArrays:
    """The dataset in the uploaded file at `path`, validated and normalised (shapes and dtypes
    in `trainers.dataset_file`). Raises DatasetRejected for anything wrong with it."""
    check_options(options)
    format_ = detect_format(path, options)
    try:
        return READERS[format_](path, options, limits)
    except DatasetRejected:
        raise
    except LIBRARY_ERRORS as exc:  # a damaged file that got past the readers' own checks
        raise DatasetRejected(
            f"the {format_} upload could not be read ({type(exc).__name__}: {exc}); check that the file is whole",
            format_,
        ) from exc


# What each format's file is, by its container: a zip, Parquet, a tar (plain or gzip) or text.
CONTAINERS = {
    "npz": ("zip",),
    "imagefolder": ("zip",),
    "idx": ("zip", "tar"),
    "parquet": ("parquet",),
    "csv": ("text",),
}
DESCRIBED = {
    "npz": "an npz (a zip of .npy arrays, as np.savez writes)",
    "imagefolder": "an ImageFolder zip",
    "idx": "a zip or tar of IDX files",
    "parquet": "a Parquet file",
    "csv": "CSV text",
}


def detect_format(path: Path, options: UploadOptions) -> str:
    """One of FORMATS: `options.format` when given (422 when the file is plainly not of it),
    else from the file's first bytes (zip, Parquet, gzip or tar magic; a zip by its member
    names), else from the client's file extension, else CSV when the file starts as
    comma-separated text. 422 otherwise."""
    check_options(options)
    with open(path, "rb") as f:
        head = f.read(512)
    if not head:
        raise DatasetRejected(f"{_named(options)}is empty: send the dataset file itself", "format")
    if options.format is not None:
        _check_given(path, head, options.format, options)
        return options.format
    return _detect(path, head, options)


def _container(path: Path, head: bytes) -> str:
    if head[:2] == b"PK":
        return "zip"
    if head[:4] == b"PAR1":
        return "parquet"
    if _is_tar(path, head):
        return "tar"
    return "text"


def _check_given(path: Path, head: bytes, given: str, options: UploadOptions) -> None:
    """422 when the file is not the container its given format is (a CSV sent as format=npz),
    naming the format it looks like instead. A file that looks like no format, or like the
    given one by its extension alone, is left to that format's reader to say what is wrong."""
    if _container(path, head) in CONTAINERS[given]:
        return
    try:
        found: str | None = _detect(path, head, replace(options, format=None))
    except DatasetRejected:
        found = None
    if found == given:
        return
    fix = f"it looks like {found}: pass format={found} or leave format out" if found else "leave format out"
    raise DatasetRejected(f"format={given} was given but {_named(options)}is not {DESCRIBED[given]}; {fix}", "format")


def _detect(path: Path, head: bytes, options: UploadOptions) -> str:
    suffix = _suffix(options.filename)
    if head[:2] == b"PK":
        return _zip_format(path, suffix)
    if head[:4] == b"PAR1":
        return "parquet"
    if _is_tar(path, head):
        return "idx"
    if suffix in EXTENSIONS:
        return EXTENSIONS[suffix]
    if _looks_like_csv(head):
        return "csv"
    raise DatasetRejected(f"{_named(options)}is in no format that uploads accept; supported are {SUPPORTED}", "format")


def _suffix(filename: str | None) -> str:
    """The lower-case extension of the client's file name ("" without one): only compared, never a path."""
    name = (filename or "").replace("\\", "/").rsplit("/", 1)[-1].lower()
    if name.endswith(".tar.gz"):
        return ".tar.gz"
    return "." + name.rsplit(".", 1)[-1] if "." in name else ""


def _named(options: UploadOptions) -> str:
    return f"the upload {options.filename[:100]!r} " if options.filename else "the upload "


def _zip_format(path: Path, suffix: str) -> str:
    """npz, idx or imagefolder, by the .npz extension or else the member names."""
    if suffix == ".npz":
        return "npz"
    with open_zip(path) as archive:
        names = [name for name in archive.namelist() if not name.endswith("/") and not is_junk(name)]
    if names and all(name.endswith(".npy") for name in names):
        return "npz"
    if any(idx_key(name) for name in names):
        return "idx"
    if any(name.lower().endswith(IMAGE_EXTENSIONS) for name in names):
        return "imagefolder"
    raise DatasetRejected(f"the zip holds none of the supported layouts; supported are {SUPPORTED}", "format")


def _is_tar(path: Path, head: bytes) -> bool:
    """A tar, plain or gzipped, by the "ustar" magic of its first header (only 512 bytes of a
    gzip stream are decompressed to look)."""
    if head[:2] == GZIP_MAGIC:
        try:
            with gzip.open(path) as stream:
                head = stream.read(512)
        except (OSError, EOFError, zlib.error):
            return False
    return head[257:262] == b"ustar"


def _looks_like_csv(head: bytes) -> bool:
    """Text without NUL bytes whose first line has a comma: UTF-8, or in another encoding
    (Latin-1, Windows-1252) without control characters but tab and line ends, which the CSV
    reader then refuses saying where it is not UTF-8."""
    try:
        text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # a cut last character is fine
    except UnicodeDecodeError:
        text = head.decode("latin-1")
        if any(ord(c) < 32 and c not in "\t\r\n" or ord(c) == 127 for c in text):
            return False
    return "\x00" not in text and "," in text.split("\n", 1)[0]
