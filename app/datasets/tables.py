"""CSV and Parquet uploads, read with pyarrow: numeric feature columns, a label column and,
optionally, a `split` column of `train`/`test` (without one, every row is train).

Features become float32 [N, D] in column order. Labels: integers or text are classes (text
class names, or integer values, sorted; y is the index into them), floats a regression target;
`UploadOptions.task` overrides the guess. Rows in messages count from 1, the header not counted.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv
import pyarrow.parquet as pq

from app.datasets.common import (
    DatasetRejected,
    UploadLimits,
    UploadOptions,
    check_classes,
    check_limit,
    check_not_empty,
    finish,
    first_nonfinite,
    to_float32,
)
from trainers.dataset_file import DatasetArrays

SPLIT = "split"
NUMERIC_FIX = "features must be numeric; encode the column as numbers (e.g. one-hot) or drop it"


def read_csv(path: Path, options: UploadOptions, limits: UploadLimits) -> DatasetArrays:
    """The CSV at `path` (UTF-8, a header row, comma-separated), validated and normalised."""
    try:
        table = pv.read_csv(path)
    except (pa.ArrowException, OSError) as exc:  # ArrowInvalid names the row of a parse error
        raise DatasetRejected(f"the CSV could not be read: {exc}; save it as UTF-8 with a header row", "CSV") from exc
    return _from_table(table, "csv", options, limits)


def read_parquet(path: Path, options: UploadOptions, limits: UploadLimits) -> DatasetArrays:
    """The Parquet file at `path`; its row count, size and column types are checked from the
    metadata before any column is read."""
    try:
        parquet = pq.ParquetFile(path)
        metadata = parquet.metadata
        check_limit(metadata.num_rows, limits.max_examples, "rows", "Parquet file", "upload a subset")
        unpacked = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
        check_limit(unpacked, limits.max_unpacked_bytes, "bytes when read", "Parquet file", "upload a subset")
        _check_schema(parquet.schema_arrow, options.label_column, limits)
        table = parquet.read()
    except (pa.ArrowException, OSError) as exc:
        raise DatasetRejected(
            f"not a readable Parquet file ({exc}); write it again with pyarrow or pandas", "Parquet"
        ) from exc
    return _from_table(table, "parquet", options, limits)


def _is_number(type_: pa.DataType) -> bool:
    return bool(pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_))


def _check_schema(schema: pa.Schema, label: str, limits: UploadLimits) -> None:
    """The columns as `_from_table` checks them, from the Parquet schema alone."""
    for name in _feature_names(schema.names, label, limits):
        type_ = schema.field(name).type
        if not _is_number(type_):
            raise DatasetRejected(f"column '{name}' holds {type_}, not numbers: {NUMERIC_FIX}", f"column '{name}'")


def _from_table(table: pa.Table, source: str, options: UploadOptions, limits: UploadLimits) -> DatasetArrays:
    label = options.label_column
    feature_names = _feature_names(table.column_names, label, limits)
    check_limit(table.num_rows, limits.max_examples, "rows", f"the {source} table", "upload a subset")
    check_not_empty(table.num_rows, f"the {source} table")
    x = _features(table, feature_names)
    train, test = _split_masks(table)
    column = table.column(label)
    _check_no_nulls(column, label)
    task = options.task or _guess_task(column.type)
    if task == "classification":
        y, class_names = _classes(column, label, train, test, limits)
    else:
        y, class_names = _targets(column, label), []
    x_test, y_test = (x[test], y[test]) if test.any() else (None, None)
    data = DatasetArrays(x[train], y[train], x_test, y_test, task, class_names, source_format=source)
    return finish(data, limits)


def _feature_names(names: list[str], label: str, limits: UploadLimits) -> list[str]:
    """The feature columns: all but the label and split ones, each named once."""
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        raise DatasetRejected(f"column names appear twice: {', '.join(twice)}; rename them", f"column '{twice[0]}'")
    if label not in names:
        raise DatasetRejected(
            f"no column '{label}' for the labels (the columns are {', '.join(names[:20])}); "
            "name it 'label' or pass label_column",
            f"column '{label}'",
        )
    features = [name for name in names if name not in (label, SPLIT)]
    if not features:
        raise DatasetRejected("the table has no feature columns: only the label (and split) columns", "columns")
    check_limit(len(features), limits.max_features, "feature columns", "the table", "drop columns")
    return features


def _first_null(column: pa.ChunkedArray) -> int | None:
    if column.null_count == 0:
        return None
    return int(np.argmax(pc.is_null(column).to_numpy(zero_copy_only=False)))


def _check_no_nulls(column: pa.ChunkedArray, name: str) -> None:
    row = _first_null(column)
    if row is not None:
        raise DatasetRejected(
            f"row {row + 1}, column '{name}' is empty (or NA/NaN): fill it or drop the row", f"column '{name}'"
        )


def _features(table: pa.Table, names: list[str]) -> np.ndarray:
    """float32 [rows, len(names)]: every column numeric, none empty, all finite."""
    x = np.empty((table.num_rows, len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        column = table.column(name)
        if not _is_number(column.type):
            raise DatasetRejected(_not_numeric(column, name), f"column '{name}'")
        _check_no_nulls(column, name)
        x[:, j] = to_float32(column.to_numpy())
    bad = first_nonfinite(x)
    if bad is not None:
        row, j = bad
        raise DatasetRejected(
            f"row {row + 1}, column '{names[j]}' is {table.column(names[j])[row].as_py()}: features must be finite "
            "numbers (no NaN or infinity, within float32's ±3.4e38); fill or drop the row",
            f"column '{names[j]}'",
        )
    return x


def _not_numeric(column: pa.ChunkedArray, name: str) -> str:
    """Where a column that is not numbers is so: the first value that does not read as one
    (a column of numbers with one "?" is read as text)."""
    values = (value for chunk in column.iterchunks() for value in chunk.to_pylist())  # a chunk at a time
    for row, value in enumerate(values):
        try:
            float(value)
        except (TypeError, ValueError):
            if value is not None:
                return f"row {row + 1}, column '{name}' is {value!r}, not a number: {NUMERIC_FIX}"
    return f"column '{name}' holds {column.type}, not numbers: {NUMERIC_FIX}"


def _split_masks(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row masks from the `split` column; every row is train without one."""
    if SPLIT not in table.column_names:
        return np.ones(table.num_rows, dtype=bool), np.zeros(table.num_rows, dtype=bool)
    column = table.column(SPLIT)
    text = pc.utf8_trim_whitespace(pc.utf8_lower(pc.cast(column, pa.string())))
    train = pc.fill_null(pc.equal(text, "train"), False).to_numpy(zero_copy_only=False)
    test = pc.fill_null(pc.equal(text, "test"), False).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(~(train | test))
    if len(bad):
        row = int(bad[0])
        raise DatasetRejected(
            f"row {row + 1}, column '{SPLIT}' is {column[row].as_py()!r}: the split must be 'train' or 'test'",
            f"row {row + 1}",
        )
    if not train.any():
        raise DatasetRejected("no row has split 'train': the train split needs examples", "train split")
    return train, test


def _guess_task(type_: pa.DataType) -> str:
    return "regression" if pa.types.is_floating(type_) else "classification"


def _classes(
    column: pa.ChunkedArray, name: str, train: np.ndarray, test: np.ndarray, limits: UploadLimits
) -> tuple[np.ndarray, list[str]]:
    """int32 class indices into the sorted train label values, and those values as names."""
    values = _class_values(column, name)
    names = np.unique(values[train])
    check_limit(len(names), limits.max_classes, "classes", f"column '{name}'", "merge classes or use regression")
    y = np.searchsorted(names, values).clip(0, len(names) - 1)
    unknown = np.flatnonzero(test & (names[y] != values))
    if len(unknown):
        row = int(unknown[0])
        raise DatasetRejected(
            f"row {row + 1}, column '{name}' is {values[row].item()!r}, a class no train row has: "
            "every test class must also appear in the train split",
            f"row {row + 1}",
        )
    check_classes(len(names), y[train], f"column '{name}'", limits)
    return y.astype(np.int32), [str(value) for value in names]


def _class_values(column: pa.ChunkedArray, name: str) -> np.ndarray:
    """The labels as int64 (whole numbers) or str (class names), one per row."""
    type_ = column.type
    if pa.types.is_integer(type_):
        return column.to_numpy().astype(np.int64)
    if pa.types.is_floating(type_):
        values = column.to_numpy()
        bad = np.flatnonzero(~np.isfinite(values) | (values != np.round(values)))
        if len(bad):
            row = int(bad[0])
            raise DatasetRejected(
                f"row {row + 1}, column '{name}' is {values[row]}: class labels must be whole numbers or text "
                "(class names); for a numeric target pass task='regression'",
                f"row {row + 1}",
            )
        return values.astype(np.int64)
    if pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_boolean(type_):
        return np.asarray(pc.cast(column, pa.string()).to_numpy(zero_copy_only=False), dtype=str)
    raise DatasetRejected(
        f"column '{name}' holds {type_}: class labels must be whole numbers or text", f"column '{name}'"
    )


def _targets(column: pa.ChunkedArray, name: str) -> np.ndarray:
    """float32 regression targets, all finite."""
    if not _is_number(column.type):
        raise DatasetRejected(
            f"column '{name}' holds {column.type}: regression targets must be numbers "
            "(for class names pass task='classification')",
            f"column '{name}'",
        )
    y = to_float32(column.to_numpy())
    bad = np.flatnonzero(~np.isfinite(y))
    if len(bad):
        row = int(bad[0])
        raise DatasetRejected(
            f"row {row + 1}, column '{name}' is {column[row].as_py()}: regression targets must be finite numbers "
            "(within float32's range)",
            f"row {row + 1}",
        )
    return y
