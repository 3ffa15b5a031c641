"""The stored form of an uploaded dataset: one safetensors file (numpy only, never pickle).

Whatever the user uploaded (npz, IDX, CSV, Parquet, an ImageFolder zip), the API validates it
once and writes this one normalised form; workers read only this.

Tensors:

- `x_train`: float32 [N, D] (a table: input_shape [D]) or uint8 [N, H, W, C] (images, 0..255:
  input_shape [H, W, C]); `x_test` [M, ...] the same, absent when the upload has no test split;
- `y_train`, `y_test`: int32 class indices in [0, num_classes) for `classification`, float32
  targets for `regression`;
- `mean`, `std`: float32 [prod(input_shape)], each feature's mean and standard deviation over
  the train split, in the units the model sees (images divided by 255).

Metadata: one safetensors metadata entry, `trainhub`, a JSON object (sorted keys: the header of a
file with several entries is not written in a fixed order, and the file's sha256 names it) with
`format` = FORMAT, `task`, `input_shape`, `class_names` ([] for regression), `source_format`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

FORMAT = "trainhub-dataset-1"
METADATA_KEY = "trainhub"
TASKS = ("classification", "regression")


class BadDatasetFile(ValueError):
    """The file is not a dataset in this form (another file, a damaged one, an older format)."""


@dataclass
class DatasetArrays:
    """A dataset in its normalised form (see the module docstring for shapes and dtypes)."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray | None
    y_test: np.ndarray | None
    task: str
    class_names: list[str] = field(default_factory=list)
    source_format: str = ""

    @property
    def input_shape(self) -> list[int]:
        return [int(d) for d in self.x_train.shape[1:]]

    @property
    def num_classes(self) -> int:
        """Classes of a classification dataset; 0 for regression."""
        return len(self.class_names) if self.task == "classification" else 0

    @property
    def is_image(self) -> bool:
        return self.x_train.dtype == np.uint8


def features(x: np.ndarray) -> np.ndarray:
    """float32 [N, prod(input_shape)]: the values the model sees (images scaled to [0, 1], in
    (row, column, channel) order)."""
    flat = x.reshape(len(x), math.prod(x.shape[1:]))
    if x.dtype == np.uint8:
        return flat.astype(np.float32) / np.float32(255)
    return flat.astype(np.float32, copy=False)


def moments(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) float32 [D] of each feature of `x` (as `features` gives them), in float64 for
    accuracy; 0 std (a constant feature) is left 0 here: `standardize` divides by 1 instead."""
    flat = features(x).astype(np.float64)
    return flat.mean(axis=0).astype(np.float32), flat.std(axis=0).astype(np.float32)


def standardize(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """(x - mean) / std per feature, float32; a feature with std 0 is only centred."""
    return ((x - mean) / np.where(std > 0, std, np.float32(1))).astype(np.float32)


def write(path: Path, data: DatasetArrays) -> None:
    """Write `data` to `path` with the train split's `mean` and `std`. The bytes depend only on
    the arrays and metadata, so the same upload gives the same file (and sha256)."""
    mean, std = moments(data.x_train)
    tensors = {"x_train": data.x_train, "y_train": data.y_train, "mean": mean, "std": std}
    if data.x_test is not None and data.y_test is not None:
        tensors |= {"x_test": data.x_test, "y_test": data.y_test}
    metadata = {
        "format": FORMAT,
        "task": data.task,
        "input_shape": data.input_shape,
        "class_names": data.class_names,
        "source_format": data.source_format,
    }
    arrays = {name: np.ascontiguousarray(a) for name, a in tensors.items()}
    save_file(arrays, str(path), metadata={METADATA_KEY: json.dumps(metadata, sort_keys=True)})


def read(path: Path) -> DatasetArrays:
    """Read a file `write` made. Raises BadDatasetFile when it is not one."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            metadata = json.loads((f.metadata() or {}).get(METADATA_KEY, "{}"))
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors raises its own SafetensorError, OSError, bad JSON
        raise BadDatasetFile(f"not a trainhub dataset file: {exc}") from exc
    if metadata.get("format") != FORMAT or metadata.get("task") not in TASKS:
        raise BadDatasetFile(f"not a {FORMAT} file (format {metadata.get('format')!r})")
    return DatasetArrays(
        x_train=tensors["x_train"],
        y_train=tensors["y_train"],
        x_test=tensors.get("x_test"),
        y_test=tensors.get("y_test"),
        task=metadata["task"],
        class_names=list(metadata.get("class_names", [])),
        source_format=metadata.get("source_format", ""),
    )
