"""MNIST-format uploads: the four IDX files in a `.zip` or a `.tar(.gz)`.

`train-images-idx3-ubyte`, `train-labels-idx1-ubyte` and, optionally together,
`t10k-images-idx3-ubyte`, `t10k-labels-idx1-ubyte`, each raw or gzipped (`.gz`), found
anywhere in the archive by their base name. Images are uint8 [N, H, W] (stored [N, H, W, 1]),
labels uint8 [N] class indices; the classes are 0..largest label. The IDX layout (as in
`trainers.data.parse_idx`): two zero bytes, a type byte, the number of dimensions, each
dimension as a big-endian uint32, then the values.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

from app.datasets.archives import Budget, gunzip, is_junk, open_zip, read_zip_member, tar_files, zip_files
from app.datasets.common import (
    DatasetRejected,
    UploadLimits,
    UploadOptions,
    check_not_empty,
    finish,
    index_classes,
)
from trainers.dataset_file import DatasetArrays

TRAIN_IMAGES, TRAIN_LABELS = "train-images-idx3-ubyte", "train-labels-idx1-ubyte"
TEST_IMAGES, TEST_LABELS = "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"
IDX_NAMES = (TRAIN_IMAGES, TRAIN_LABELS, TEST_IMAGES, TEST_LABELS)
UBYTE = 0x08  # the IDX type byte of unsigned bytes, MNIST's


def idx_key(member: str) -> str | None:
    """Which of IDX_NAMES an archive member is, by its base name with any `.gz` removed."""
    base = member.rsplit("/", 1)[-1].removesuffix(".gz")
    return base if base in IDX_NAMES and not is_junk(member) else None


def read_idx_archive(path: Path, options: UploadOptions, limits: UploadLimits) -> DatasetArrays:
    """The IDX files in the zip or tar at `path`, validated and normalised."""
    if options.task == "regression":
        raise DatasetRejected("IDX labels are classes: use task='classification' (or upload a table or npz)", "task")
    budget = Budget(limits.max_unpacked_bytes)
    files = _zip_members(path, limits, budget) if _is_zip(path) else _tar_members(path, limits, budget)
    for key in (TRAIN_IMAGES, TRAIN_LABELS):
        if key not in files:
            raise DatasetRejected(
                f"the archive has no {key}(.gz): it needs {TRAIN_IMAGES} and {TRAIN_LABELS}, "
                f"optionally {TEST_IMAGES} and {TEST_LABELS} (each raw or .gz)",
                key,
            )
    if (TEST_IMAGES in files) != (TEST_LABELS in files):
        missing = TEST_LABELS if TEST_IMAGES in files else TEST_IMAGES
        raise DatasetRejected(f"the archive has one test file without the other: add {missing} or drop both", missing)
    x_train, y_train = _split(files[TRAIN_IMAGES], files[TRAIN_LABELS], budget)
    x_test, y_test = _split(files[TEST_IMAGES], files[TEST_LABELS], budget) if TEST_IMAGES in files else (None, None)
    names = (files[TRAIN_LABELS][0], files[TEST_LABELS][0] if TEST_LABELS in files else "")
    y_train, y_test, class_names = index_classes(y_train, y_test, limits, names)
    data = DatasetArrays(x_train, y_train, x_test, y_test, "classification", class_names, source_format="idx")
    return finish(data, limits, test_where=files[TEST_IMAGES][0] if TEST_IMAGES in files else "test split")


def _is_zip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"PK"


def _choose(names: list[str]) -> dict[str, str]:
    """IDX key -> the member that holds it. A raw file and its .gz side by side (as
    torchvision's raw/ folder has them) are one file: the raw one is used. Two in different
    places are ambiguous."""
    by_key: dict[str, list[str]] = defaultdict(list)
    for name in names:
        if key := idx_key(name):
            by_key[key].append(name)
    chosen = {}
    for key, found in by_key.items():
        raw = [name for name in found if not name.endswith(".gz")]
        if len({name.removesuffix(".gz") for name in found}) > 1:
            raise DatasetRejected(
                f"the archive has {key} more than once ({', '.join(sorted(found))}): keep one dataset per archive", key
            )
        chosen[key] = raw[0] if raw else found[0]
    return chosen


def _zip_members(path: Path, limits: UploadLimits, budget: Budget) -> dict[str, tuple[str, bytes]]:
    """IDX key -> (member name, its bytes, still gzipped where they were)."""
    with open_zip(path) as archive:
        infos = {info.filename: info for info in zip_files(archive, limits)}
        chosen = _choose(list(infos))
        return {key: (name, read_zip_member(archive, infos[name], budget)) for key, name in chosen.items()}


def _tar_members(path: Path, limits: UploadLimits, budget: Budget) -> dict[str, tuple[str, bytes]]:
    found = tar_files(path, lambda name: idx_key(name) is not None, limits, budget)
    return {key: (name, found[name]) for key, name in _choose(list(found)).items()}


def _split(images: tuple[str, bytes], labels: tuple[str, bytes], budget: Budget) -> tuple[np.ndarray, np.ndarray]:
    """(uint8 [N, H, W, 1] images, uint8 [N] labels) of one split."""
    x = _parse(gunzip(images[1], budget, images[0]), images[0], ndim=3)
    y = _parse(gunzip(labels[1], budget, labels[0]), labels[0], ndim=1)
    check_not_empty(len(x), images[0])
    if len(x) != len(y):
        raise DatasetRejected(
            f"{images[0]} has {len(x)} images but {labels[0]} has {len(y)} labels: they must be the same count "
            "(the two files of one split)",
            labels[0],
        )
    return x[..., np.newaxis], y


def _parse(data: bytes, where: str, ndim: int) -> np.ndarray:
    """One IDX file of unsigned bytes with `ndim` dimensions (3 for images, 1 for labels)."""
    what = "images" if ndim == 3 else "labels"
    if len(data) < 4 or data[:2] != b"\x00\x00":
        raise DatasetRejected(f"{where} is not an IDX file (it does not start with the IDX header)", where)
    if data[2] != UBYTE or data[3] != ndim:
        raise DatasetRejected(
            f"{where} holds type 0x{data[2]:02x} in {data[3]} dimensions; MNIST-format {what} are unsigned bytes "
            f"(0x08) in {ndim}",
            where,
        )
    offset = 4 + 4 * ndim
    if len(data) < offset:
        raise DatasetRejected(f"{where} is cut off inside its header; upload the whole file", where)
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    count = math.prod(shape)
    if len(data) < offset + count:
        raise DatasetRejected(
            f"{where} is cut off: its header declares shape {list(shape)} ({offset + count:,} bytes) but it has "
            f"{len(data):,} bytes; upload the whole file",
            where,
        )
    return np.frombuffer(data, dtype=np.uint8, count=count, offset=offset).reshape(shape).copy()
