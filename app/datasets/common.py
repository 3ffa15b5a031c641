"""What every upload format shares: the caller's options, the limits, the one error type, and
the checks that apply to any dataset once it is in arrays (counts, finiteness, classes, splits).

Row numbers in messages are 0-based array indices for arrays (npz, IDX) and 1-based data rows
(the header not counted) for tables, as a spreadsheet user would count them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from trainers.dataset_file import DatasetArrays

FORMATS = ("npz", "idx", "csv", "parquet", "imagefolder")
TASKS = ("classification", "regression")
# The server settings behind the UploadLimits an operator can change (app/api/datasets.py),
# named in each 413 as the other limits' messages name theirs.
EXAMPLES = "max_dataset_examples, set by TRAINHUB_MAX_DATASET_EXAMPLES"
UNPACKED = "max_dataset_unpacked_bytes, set by TRAINHUB_MAX_DATASET_UNPACKED_BYTES"
FILES = "max_dataset_files, set by TRAINHUB_MAX_DATASET_FILES"
PIXELS = "max_image_pixels, set by TRAINHUB_MAX_IMAGE_PIXELS"
# Class names are shown in terminals (the CLI) and the dashboard: no control characters (C0,
# DEL, C1: terminal escapes, BEL), line or paragraph separators, or bidi controls (which
# reorder what is shown around them), and a length that fits on a line.
MAX_CLASS_NAME_CHARS = 200
_UNSHOWABLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


@dataclass(frozen=True)
class UploadOptions:
    """How to read an upload. `filename` is the client's name for it, used only for its
    extension (never as a path); `format` one of FORMATS or None to detect; `label_column` the
    label of a table; `task` one of TASKS or None to infer it from the labels; `image_size`
    (height, width) in pixels to resize ImageFolder images to, None to keep their own size."""

    filename: str | None = None
    format: str | None = None
    label_column: str = "label"
    task: str | None = None
    image_size: tuple[int, int] | None = None


@dataclass(frozen=True)
class UploadLimits:
    """Caps on what an upload may unpack to. Over any of them is a 413."""

    max_examples: int = 1_000_000  # train + test
    max_unpacked_bytes: int = 4 << 30  # all decompressed bytes of an archive or gzip stream
    max_files: int = 100_000  # members of an archive
    max_image_pixels: int = 4096 * 4096  # width * height of one image, from its header
    max_features: int = 1_000_000  # prod(input_shape)
    max_classes: int = 10_000


class DatasetRejected(Exception):
    """Upload refused: `message` names the problem, where it is (file part or archive member,
    row, column or array) and the fix; `where` a short locator such as "x_train",
    "column 'age'", "row 17", "train/cat/3.png"; `status` 422, or 413 for sizes and counts over
    the limits."""

    def __init__(self, message: str, where: str = "", status: int = 422) -> None:
        super().__init__(message)
        self.message = message
        self.where = where
        self.status = status


def check_options(options: UploadOptions) -> None:
    """Refuse options that cannot be honoured, before the file is read."""
    if options.format is not None and options.format not in FORMATS:
        raise DatasetRejected(f"unknown format {options.format!r}: use one of {', '.join(FORMATS)}", "format")
    if options.task is not None and options.task not in TASKS:
        raise DatasetRejected(f"unknown task {options.task!r}: use one of {', '.join(TASKS)}", "task")
    if options.image_size is not None:
        size = options.image_size
        if len(size) != 2 or not all(isinstance(d, int) and d > 0 for d in size):
            raise DatasetRejected(f"image_size {size!r} must be two positive integers (height, width)", "image_size")
    if not options.label_column:
        raise DatasetRejected("label_column must name a column", "label_column")


def check_limit(count: int, limit: int, what: str, where: str, fix: str, setting: str = "") -> None:
    """413 when `count` of `what` (e.g. "examples") at `where` is over `limit`; `setting` names
    the server setting and variable behind it (EXAMPLES, UNPACKED, FILES, PIXELS), "" for caps
    that are not settings."""
    if count > limit:
        named = f" ({setting})" if setting else ""
        raise DatasetRejected(f"{where}: {count:,} {what} is over the limit of {limit:,}{named}; {fix}", where, 413)


def class_name_problem(name: str) -> str | None:
    """What makes `name` unfit to be a class name ("is 300 characters long, ...", "holds the
    control character U+001B"), None when it is fine."""
    if len(name) > MAX_CLASS_NAME_CHARS:
        return f"is {len(name):,} characters long, over the limit of {MAX_CLASS_NAME_CHARS} for a class name"
    if found := _UNSHOWABLE.search(name):
        return f"holds the control character U+{ord(found[0]):04X} (terminal escapes and bidi controls are refused)"
    return None


def shown(text: str, length: int = 60) -> str:
    """`text` quoted for a message, with control characters escaped (repr) and cut to `length`."""
    return repr(text[:length]) + ("..." if len(text) > length else "")


def first_nonfinite(x: np.ndarray) -> tuple[int, int] | None:
    """(row, column) of the first NaN or infinite value of a 2-D float array, in row order."""
    bad = np.flatnonzero(~np.isfinite(x))
    if len(bad) == 0:
        return None
    row, column = divmod(int(bad[0]), x.shape[1])
    return row, column


def to_float32(values: np.ndarray) -> np.ndarray:
    """`values` as float32. Numbers beyond its range (±3.4e38) become ±inf, which the callers
    refuse as not finite, so numpy's overflow warning is not wanted here."""
    with np.errstate(over="ignore"):
        return values.astype(np.float32)


def check_classes(num_classes: int, train_labels: np.ndarray, where: str, limits: UploadLimits) -> None:
    """At least two distinct classes among the train labels, and no more than the limit."""
    check_limit(num_classes, limits.max_classes, "classes", where, "merge classes or upload a regression task")
    present = len(np.unique(train_labels))
    if present < 2:
        raise DatasetRejected(
            f"{where}: the train split has {present} class{'' if present == 1 else 'es'}; classification needs "
            "at least 2 (for a numeric target pass task='regression')",
            where,
        )


def finish(data: DatasetArrays, limits: UploadLimits, test_where: str = "test split") -> DatasetArrays:
    """The checks every format ends with: non-empty splits of the same feature shape, and the
    example and feature counts within limits. Returns `data` unchanged."""
    check_not_empty(len(data.x_train), "the train split")
    total = len(data.x_train) + (0 if data.x_test is None else len(data.x_test))
    check_limit(total, limits.max_examples, "examples", "train + test", "upload a subset", EXAMPLES)
    features = int(np.prod(data.input_shape))
    check_has_features(features, data.input_shape, "the train split")
    check_limit(features, limits.max_features, "features per example", "input shape", "reduce the inputs")
    if data.x_test is None:
        return data
    check_not_empty(len(data.x_test), test_where)
    if list(data.x_test.shape[1:]) != data.input_shape or data.x_test.dtype != data.x_train.dtype:
        raise DatasetRejected(
            f"{test_where} has examples of shape {list(data.x_test.shape[1:])} ({data.x_test.dtype}) but the "
            f"train split {data.input_shape} ({data.x_train.dtype}): both splits need the same shape",
            test_where,
        )
    return data


def check_has_features(features: int, shape: list[int] | tuple[int, ...], where: str) -> None:
    """422 for examples of no features (a [N, 0] array, images 0 pixels wide)."""
    if features == 0:
        raise DatasetRejected(
            f"{where} has examples of shape {list(shape)}, 0 features each: a dataset needs at least one feature",
            where,
        )


def check_not_empty(count: int, where: str) -> None:
    """422 for a split given with no examples (a missing test split is fine; an empty one is a mistake)."""
    if count == 0:
        raise DatasetRejected(f"{where} has no examples: give it some (a test split may be left out instead)", where)


def index_classes(
    y_train: np.ndarray, y_test: np.ndarray | None, limits: UploadLimits, names: tuple[str, str] = ("y_train", "y_test")
) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    """Labels that are already class indices (npz, IDX): whole numbers >= 0; the classes are
    0..largest (so `class_names` are "0", "1", ...). Returns (y_train, y_test) as int32 and
    the class names."""
    splits = [(y_train, names[0])] + ([] if y_test is None else [(y_test, names[1])])
    for y, where in splits:
        _check_indices(y, where)
    num_classes = max(int(y.max()) for y, _ in splits if y.size) + 1
    check_classes(num_classes, y_train, names[0], limits)
    as_int32 = [y.astype(np.int32) for y, _ in splits]
    return as_int32[0], (as_int32[1] if y_test is not None else None), [str(c) for c in range(num_classes)]


def _check_indices(y: np.ndarray, where: str) -> None:
    if y.dtype.kind not in "biuf":
        raise DatasetRejected(f"{where} has dtype {y.dtype}: class labels must be integer class indices", where)
    whole = np.isfinite(y) & (y == np.round(y)) if y.dtype.kind == "f" else np.ones(len(y), dtype=bool)
    bad = np.flatnonzero(~whole)
    if len(bad):
        row = int(bad[0])
        raise DatasetRejected(
            f"{where} row {row} is {y[row]}: class labels must be whole numbers (class indices 0, 1, 2, ...); "
            "for a numeric target pass task='regression'",
            where,
        )
    negative = np.flatnonzero(y < 0)
    if len(negative):
        row = int(negative[0])
        raise DatasetRejected(f"{where} row {row} is {y[row]}: class indices must be 0 or more", where)
