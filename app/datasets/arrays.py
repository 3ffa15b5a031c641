"""NumPy `.npz` uploads: `x_train`, `y_train` and optionally `x_test`, `y_test`.

`x` is [N, D] features (any numeric dtype, stored float32) or uint8 images [N, H, W] or
[N, H, W, C] (stored [N, H, W, C]). `y` is [N]: class indices (integers >= 0) for
classification, numbers for regression. Read with `np.load(allow_pickle=False)` only, after the
zip directory and each array's .npy header (shape, dtype) were checked, so an object array or
an oversized one is refused before a byte of its data is read. np.load allocates what a header
declares before it reads the data, so each header's shape must fit in its member's unpacked
size (a few bytes declaring terabytes are refused, not allocated).
"""

from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.datasets.archives import READ_ERRORS, open_zip, zip_files
from app.datasets.common import (
    EXAMPLES,
    UNPACKED,
    DatasetRejected,
    UploadLimits,
    UploadOptions,
    check_has_features,
    check_limit,
    check_not_empty,
    finish,
    first_nonfinite,
    index_classes,
    to_float32,
)
from trainers.dataset_file import DatasetArrays

ARRAYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass(frozen=True)
class Header:
    """One array's .npy header: its shape and dtype, and the bytes it declares (the header's
    own and prod(shape) * itemsize of data)."""

    shape: tuple[int, ...]
    dtype: np.dtype
    declared_bytes: int


def read_npz(path: Path, options: UploadOptions, limits: UploadLimits) -> DatasetArrays:
    """The npz at `path`, validated and normalised (see the module docstring)."""
    headers = _headers(path, limits)
    _check_declared(headers, limits)
    arrays = _load(path, list(headers))
    x_train = _features(arrays["x_train"], "x_train")
    x_test = _features(arrays["x_test"], "x_test") if "x_test" in arrays else None
    y_train = _labels(arrays["y_train"], "y_train", len(x_train))
    y_test = _labels(arrays["y_test"], "y_test", len(x_test)) if x_test is not None else None
    task = options.task or ("regression" if y_train.dtype.kind == "f" else "classification")
    if task == "classification":
        y_train, y_test, class_names = index_classes(y_train, y_test, limits)
    else:
        y_train, class_names = _targets(y_train, "y_train"), []
        y_test = _targets(y_test, "y_test") if y_test is not None else None
    data = DatasetArrays(x_train, y_train, x_test, y_test, task, class_names, source_format="npz")
    return finish(data, limits, test_where="x_test")


def _headers(path: Path, limits: UploadLimits) -> dict[str, Header]:
    """Each array's (shape, dtype) from its .npy header; refuses unknown, missing and object arrays."""
    with open_zip(path) as archive:
        infos = {info.filename: info for info in zip_files(archive, limits)}
        allowed = [f"{name}.npy" for name in ARRAYS]
        for filename in infos:
            if filename not in allowed:
                raise DatasetRejected(
                    f"{filename}: unknown array in the npz; the allowed ones are {', '.join(ARRAYS)} "
                    "(np.savez(path, x_train=..., y_train=..., x_test=..., y_test=...))",
                    filename,
                )
        headers = {filename.removesuffix(".npy"): _header(archive, info) for filename, info in infos.items()}
        for name, header in headers.items():
            _check_fits(name, header, infos[f"{name}.npy"])
    for name in ("x_train", "y_train"):
        if name not in headers:
            raise DatasetRejected(
                f"the npz has no {name}: it needs x_train and y_train (x_test, y_test optional)", name
            )
    if ("x_test" in headers) != ("y_test" in headers):
        given, missing = ("x_test", "y_test") if "x_test" in headers else ("y_test", "x_test")
        raise DatasetRejected(f"the npz has {given} but no {missing}: give both or neither", missing)
    return headers


def _header(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Header:
    name = info.filename.removesuffix(".npy")
    try:
        with archive.open(info) as stream:
            version = np.lib.format.read_magic(stream)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dtype = read(stream)
            header_bytes = stream.tell()
    except (ValueError, *READ_ERRORS) as exc:
        raise DatasetRejected(f"{name}: not a readable .npy array ({exc}); save it with np.savez", name) from exc
    if dtype.hasobject:
        raise DatasetRejected(
            f"{name} holds Python objects (dtype object), which only pickle can read and uploads never are; "
            "save a numeric array instead, e.g. np.asarray(x, dtype=np.float32)",
            name,
        )
    if dtype.kind not in "biuf":
        raise DatasetRejected(f"{name} has dtype {dtype}: arrays must be numbers (bool, int, uint or float)", name)
    shape = tuple(int(d) for d in shape)
    return Header(shape, dtype, header_bytes + math.prod(shape) * dtype.itemsize)


def _check_fits(name: str, header: Header, info: zipfile.ZipInfo) -> None:
    """422 when the header declares more bytes than its member unpacks to: np.load would
    allocate the declared array before finding the data missing."""
    if header.declared_bytes > info.file_size:
        raise DatasetRejected(
            f"{name}'s header declares shape {header.shape} = {header.declared_bytes:,} bytes but the member holds "
            f"{info.file_size:,}: the array is cut off or its header is wrong; save it again with np.savez",
            name,
        )


def _check_declared(headers: dict[str, Header], limits: UploadLimits) -> None:
    """Counts and sizes from the headers alone, before the data is loaded."""
    for name in ("x_train", "x_test"):
        if name in headers:
            shape = headers[name].shape
            if len(shape) < 2:
                raise DatasetRejected(f"{name} has shape {list(shape)}: it needs one row per example, [N, D]", name)
            check_not_empty(shape[0], name)
            features = math.prod(shape[1:])
            check_has_features(features, shape[1:], name)
            check_limit(features, limits.max_features, "features per example", name, "reduce inputs")
    total = sum(headers[name].shape[0] for name in ("x_train", "x_test") if name in headers)
    check_limit(total, limits.max_examples, "examples", "x_train + x_test", "upload a subset", EXAMPLES)
    # What loading takes: the arrays as declared, and [N, D] features again as a float32 copy.
    loaded = sum(header.declared_bytes for header in headers.values())
    loaded += sum(
        math.prod(headers[name].shape) * 4
        for name in ("x_train", "x_test")
        if name in headers and len(headers[name].shape) == 2
    )
    check_limit(loaded, limits.max_unpacked_bytes, "bytes when loaded", "the npz's arrays", "upload a subset", UNPACKED)


def _load(path: Path, names: list[str]) -> dict[str, np.ndarray]:
    arrays = {}
    with np.load(path, allow_pickle=False) as npz:
        for name in names:
            try:
                arrays[name] = npz[name]
            except (ValueError, *READ_ERRORS) as exc:  # ValueError: pickled or damaged data
                raise DatasetRejected(
                    f"{name}: could not read the array ({exc}); save numeric arrays with np.savez", name
                ) from exc
    return arrays


def _features(x: np.ndarray, name: str) -> np.ndarray:
    """float32 [N, D] from a table, uint8 [N, H, W, C] from images."""
    if x.ndim == 2:
        features = to_float32(x)
        bad = first_nonfinite(features)
        if bad is not None:
            row, column = bad
            raise DatasetRejected(
                f"{name} row {row}, feature {column} is {x[row, column]}: features must be finite numbers "
                "(no NaN or infinity, within float32's ±3.4e38); fill or drop that row",
                name,
            )
        return features
    if x.ndim in (3, 4) and x.dtype == np.uint8:
        return x[..., np.newaxis] if x.ndim == 3 else x
    if x.ndim in (3, 4):
        raise DatasetRejected(
            f"{name} has shape {list(x.shape)} and dtype {x.dtype}: images must be uint8 0..255 "
            "([N, H, W] or [N, H, W, C]); other features must be flattened to [N, D]",
            name,
        )
    raise DatasetRejected(
        f"{name} has shape {list(x.shape)}: use [N, D] features or uint8 images [N, H, W] / [N, H, W, C]", name
    )


def _labels(y: np.ndarray, name: str, examples: int) -> np.ndarray:
    """`y` checked to be one label per example."""
    x_name = "x" + name.removeprefix("y")
    if y.ndim != 1:
        raise DatasetRejected(f"{name} has shape {list(y.shape)}: labels must be [N], one per example", name)
    if len(y) != examples:
        raise DatasetRejected(
            f"{name} has {len(y)} labels but {x_name} has {examples} examples: they must be the same length", name
        )
    return y


def _targets(y: np.ndarray, name: str) -> np.ndarray:
    """Regression targets as float32, all finite."""
    targets = to_float32(y)
    bad = np.flatnonzero(~np.isfinite(targets))
    if len(bad):
        row = int(bad[0])
        raise DatasetRejected(
            f"{name} row {row} is {y[row]}: regression targets must be finite numbers (within float32's range)", name
        )
    return targets
