"""CSV and Parquet uploads, read with pyarrow: numeric feature columns, a label column and,
optionally, a `split` column of `train`/`test` (without one, every row is train).

Features become float32 [N, D] in column order. Labels: integers or text are classes (text
class names, or integer values, sorted; y is the index into them), floats a regression target;
`UploadOptions.task` overrides the guess. Rows in messages count from 1, the header not counted.

pandas' Parquet is read as pandas wrote it: categorical columns (Arrow dictionaries) are
decoded, and its index columns (`__index_level_0__`, or those its metadata names) are not
features. A Parquet file's encoded size says little of its decoded one (a constant column
dictionary- or run-length-encoded is a few bytes for any number of rows), so what reading it
would take is bounded from its row count and column types before any column is read, and its
text columns are read as dictionaries (each distinct value once).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pv
import pyarrow.parquet as pq

from app.datasets.common import (
    EXAMPLES,
    UNPACKED,
    DatasetRejected,
    UploadLimits,
    UploadOptions,
    check_classes,
    check_limit,
    check_not_empty,
    class_name_problem,
    finish,
    first_nonfinite,
    shown,
    to_float32,
)
from trainers.dataset_file import DatasetArrays

SPLIT = "split"
NUMERIC_FIX = "features must be numeric; encode the column as numbers (e.g. one-hot) or drop it"
UTF8_FIX = "save the file as UTF-8 (in Excel: 'CSV UTF-8'; in pandas: to_csv(..., encoding='utf-8'))"
WHOLE_NUMBER = re.compile(r"-?[0-9]+")
PANDAS_INDEX = re.compile(r"__index_level_\d+__")  # the name pyarrow gives an unnamed pandas index


def read_csv(path: Path, options: UploadOptions, limits: UploadLimits) -> DatasetArrays:
    """The CSV at `path` (UTF-8, a header row, comma-separated), validated and normalised."""
    try:
        table = pv.read_csv(path)
        table.column_names  # noqa: B018 — decodes the header's names: UnicodeDecodeError when not UTF-8
    except UnicodeDecodeError as exc:
        raise DatasetRejected(_header_not_utf8(path), "header row") from exc
    except (pa.ArrowException, OSError) as exc:  # ArrowInvalid names the row of a parse error
        if "utf8" in str(exc).lower() or "utf-8" in str(exc).lower():
            raise DatasetRejected(f"the CSV is not UTF-8 text ({exc}); {UTF8_FIX}", "CSV") from exc
        raise DatasetRejected(f"the CSV could not be read: {exc}; save it as UTF-8 with a header row", "CSV") from exc
    _check_utf8(table)
    return _from_table(table, "csv", options, limits)


def _header_not_utf8(path: Path) -> str:
    """Where the header row stops being UTF-8: the byte and the column it is in."""
    with open(path, "rb") as f:
        line = f.readline(1 << 20)
    try:
        line.decode("utf-8")
    except UnicodeDecodeError as exc:
        column = line[: exc.start].count(b",") + 1
        return (
            f"the CSV's header row is not UTF-8 text: byte 0x{line[exc.start]:02x} in the name of column {column} "
            f"is not UTF-8; {UTF8_FIX}"
        )
    return f"the CSV's column names are not UTF-8 text; {UTF8_FIX}"


def _check_utf8(table: pa.Table) -> None:
    """pyarrow reads a CSV column holding bytes that are not UTF-8 as binary: name the first such row."""
    for name in table.column_names:
        column = table.column(name)
        if not _is_binary(column.type):
            continue
        values = (value for chunk in column.iterchunks() for value in chunk.to_pylist())  # a chunk at a time
        for row, value in enumerate(values):
            if value is None:
                continue
            try:
                value.decode("utf-8")
            except UnicodeDecodeError:
                raise DatasetRejected(
                    f"row {row + 1}, column '{name}' is not UTF-8 text ({value[:40]!r}); {UTF8_FIX}", f"row {row + 1}"
                ) from None
        raise DatasetRejected(f"column '{name}' is not UTF-8 text; {UTF8_FIX}", f"column '{name}'")


def read_parquet(path: Path, options: UploadOptions, limits: UploadLimits) -> DatasetArrays:
    """The Parquet file at `path`; its row count, column types and decoded size are checked
    from the metadata before any column is read, and only the columns used are read."""
    try:
        parquet = pq.ParquetFile(path)
        metadata = parquet.metadata
        check_limit(metadata.num_rows, limits.max_examples, "rows", "Parquet file", "upload a subset", EXAMPLES)
        schema = parquet.schema_arrow
        columns = _check_schema(schema, options.label_column, limits)
        _check_decoded_size(metadata, schema, columns, limits)
        text = [name for name in columns if _is_text(schema.field(name).type)]
        table = pq.ParquetFile(path, read_dictionary=text).read(columns=columns)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetRejected(
            f"not a readable Parquet file ({exc}); write it again with pyarrow or pandas", "Parquet"
        ) from exc
    return _from_table(table, "parquet", options, limits)


def _is_number(type_: pa.DataType) -> bool:
    """Numbers, or a dictionary (a pandas categorical) of numbers."""
    if pa.types.is_dictionary(type_):
        return _is_number(type_.value_type)
    return bool(pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_boolean(type_))


def _is_text(type_: pa.DataType) -> bool:
    """Text, or a dictionary (a pandas categorical) of text."""
    if pa.types.is_dictionary(type_):
        return _is_text(type_.value_type)
    return bool(pa.types.is_string(type_) or pa.types.is_large_string(type_) or pa.types.is_string_view(type_))


def _is_binary(type_: pa.DataType) -> bool:
    return bool(pa.types.is_binary(type_) or pa.types.is_large_binary(type_) or pa.types.is_binary_view(type_))


def _pandas_index(schema: pa.Schema) -> set[str]:
    """The columns that hold a pandas index: by pyarrow's name for an unnamed one, and those
    the pandas metadata lists (a RangeIndex is listed as a dict and is no column)."""
    names = {name for name in schema.names if PANDAS_INDEX.fullmatch(name)}
    try:
        metadata = schema.pandas_metadata or {}
    except ValueError:  # metadata that is not JSON: nothing to learn from it
        metadata = {}
    index = metadata.get("index_columns") if isinstance(metadata, dict) else None
    if isinstance(index, list):
        names |= {name for name in index if isinstance(name, str)}
    return names


def _check_schema(schema: pa.Schema, label: str, limits: UploadLimits) -> list[str]:
    """The columns to read (features, label, split), checked as `_from_table` checks them, from
    the Parquet schema alone; a type that could not be bounded or used is refused here."""
    features = _feature_names(schema.names, label, limits, _pandas_index(schema))
    for name in features:
        type_ = schema.field(name).type
        if not _is_number(type_):
            raise DatasetRejected(f"column '{name}' holds {type_}, not numbers: {NUMERIC_FIX}", f"column '{name}'")
    columns = [*features, label]
    label_type = schema.field(label).type
    if not (_is_number(label_type) or _is_text(label_type)):
        raise DatasetRejected(
            f"column '{label}' holds {label_type}: labels must be numbers or text (class names)", f"column '{label}'"
        )
    if SPLIT in schema.names and label != SPLIT:
        split_type = schema.field(SPLIT).type
        if not (_is_number(split_type) or _is_text(split_type)):
            raise DatasetRejected(
                f"column '{SPLIT}' holds {split_type}: the split must be text, 'train' or 'test'", f"column '{SPLIT}'"
            )
        columns.append(SPLIT)
    return columns


def _check_decoded_size(metadata: pq.FileMetaData, schema: pa.Schema, columns: list[str], limits: UploadLimits) -> None:
    """413 when reading `columns` would decode past the unpacked-bytes limit: each number
    column rows x max(8, its width) (its Arrow array, then as float32), each text column (read
    as a dictionary) rows x 8 of indices plus its distinct values, which its pages hold
    uncompressed in at most their uncompressed size."""
    rows = metadata.num_rows
    uncompressed: Counter[str] = Counter()
    for i in range(metadata.num_row_groups):
        group = metadata.row_group(i)
        for j in range(group.num_columns):
            chunk = group.column(j)
            uncompressed[chunk.path_in_schema] += chunk.total_uncompressed_size
    total = 0
    for name in columns:
        type_ = schema.field(name).type
        if pa.types.is_dictionary(type_) or _is_text(type_):
            total += rows * 16 + uncompressed[name]  # indices, then a number category decoded
        else:
            total += rows * max(8, type_.bit_width // 8)
    what = f"bytes when decoded ({rows:,} rows x {len(columns):,} columns)"
    check_limit(total, limits.max_unpacked_bytes, what, "Parquet file", "upload a subset", UNPACKED)


def _from_table(table: pa.Table, source: str, options: UploadOptions, limits: UploadLimits) -> DatasetArrays:
    label = options.label_column
    feature_names = _feature_names(table.column_names, label, limits)
    check_limit(table.num_rows, limits.max_examples, "rows", f"the {source} table", "upload a subset", EXAMPLES)
    check_not_empty(table.num_rows, f"the {source} table")
    floats = table.num_rows * len(feature_names) * 4
    what = f"bytes as float32 features ({table.num_rows:,} rows x {len(feature_names):,} columns)"
    check_limit(floats, limits.max_unpacked_bytes, what, f"the {source} table", "upload a subset", UNPACKED)
    x = _features(table, feature_names)
    train, test = _split_masks(table, label)
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


def _feature_names(names: list[str], label: str, limits: UploadLimits, index: set[str] | None = None) -> list[str]:
    """The feature columns: all but the label, split and pandas index ones, each named once."""
    twice = sorted(name for name, count in Counter(names).items() if count > 1)
    if twice:
        raise DatasetRejected(f"column names appear twice: {', '.join(twice)}; rename them", f"column '{twice[0]}'")
    if label not in names:
        raise DatasetRejected(
            f"no column '{label}' for the labels (the columns are {', '.join(names[:20])}); "
            "name it 'label' or pass label_column",
            f"column '{label}'",
        )
    index = (index or set()) | {name for name in names if PANDAS_INDEX.fullmatch(name)}
    features = [name for name in names if name not in (label, SPLIT) and name not in index]
    if not features:
        raise DatasetRejected(
            "the table has no feature columns, only the label (and split or pandas index) columns: "
            "a dataset needs at least one feature",
            "columns",
        )
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


def _decoded(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary column of numbers as those numbers; any other column as it is."""
    if pa.types.is_dictionary(column.type) and not _is_text(column.type):
        return column.cast(column.type.value_type)
    return column


def _features(table: pa.Table, names: list[str]) -> np.ndarray:
    """float32 [rows, len(names)]: every column numeric, none empty, all finite."""
    x = np.empty((table.num_rows, len(names)), dtype=np.float32)
    for j, name in enumerate(names):
        column = table.column(name)
        if not _is_number(column.type):
            raise DatasetRejected(_not_numeric(column, name), f"column '{name}'")
        _check_no_nulls(column, name)
        x[:, j] = to_float32(_decoded(column).to_numpy())
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
                return f"row {row + 1}, column '{name}' is {shown(str(value))}, not a number: {NUMERIC_FIX}"
    return f"column '{name}' holds {column.type}, not numbers: {NUMERIC_FIX}"


def _distinct(column: pa.ChunkedArray, name: str) -> tuple[list[object], np.ndarray]:
    """(the distinct values, for each row the index of its value or -1 for null), a chunk at a
    time through dictionaries: each distinct value is made a Python object once, however many
    rows repeat it."""
    values: dict[object, int] = {}
    codes = []
    for chunk in column.iterchunks():
        encoded = chunk if pa.types.is_dictionary(chunk.type) else chunk.dictionary_encode()
        lookup = np.array([values.setdefault(value, len(values)) for value in encoded.dictionary.to_pylist()] + [-1])
        indices = encoded.indices.fill_null(-1).to_numpy().astype(np.int64)
        if len(indices) and indices.max() >= len(lookup) - 1:
            raise DatasetRejected(
                f"column '{name}' refers past its dictionary; write the file again", f"column '{name}'"
            )
        codes.append(lookup[indices])
    return list(values), (np.concatenate(codes) if codes else np.zeros(0, dtype=np.int64))


def _as_text(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """The column as text (a dictionary of text stays one): numbers and booleans cast."""
    if _is_text(column.type):
        return column
    return _decoded(column).cast(pa.string())


def _split_masks(table: pa.Table, label: str) -> tuple[np.ndarray, np.ndarray]:
    """(train, test) row masks from the `split` column; every row is train without one."""
    if SPLIT not in table.column_names or label == SPLIT:
        return np.ones(table.num_rows, dtype=bool), np.zeros(table.num_rows, dtype=bool)
    column = table.column(SPLIT)
    values, codes = _distinct(_as_text(column), SPLIT)
    # 1 train, 2 test, 0 anything else; the last entry is for nulls (code -1).
    kinds = [{"train": 1, "test": 2}.get(str(value).strip().lower(), 0) for value in values]
    kind = np.array([*kinds, 0], dtype=np.int8)[codes]
    train, test = kind == 1, kind == 2
    bad = np.flatnonzero(kind == 0)
    if len(bad):
        row = int(bad[0])
        value = column[row].as_py()
        raise DatasetRejected(
            f"row {row + 1}, column '{SPLIT}' is {shown(value) if isinstance(value, str) else repr(value)}: "
            "the split must be 'train' or 'test'",
            f"row {row + 1}",
        )
    if not train.any():
        raise DatasetRejected("no row has split 'train': the train split needs examples", "train split")
    return train, test


def _guess_task(type_: pa.DataType) -> str:
    if pa.types.is_dictionary(type_):
        return _guess_task(type_.value_type)
    return "regression" if pa.types.is_floating(type_) else "classification"


def _classes(
    column: pa.ChunkedArray, name: str, train: np.ndarray, test: np.ndarray, limits: UploadLimits
) -> tuple[np.ndarray, list[str]]:
    """int32 class indices into the sorted train label values, and those values as names."""
    names, codes = _class_codes(column, name)
    present = np.unique(codes[train])
    check_limit(len(present), limits.max_classes, "classes", f"column '{name}'", "merge classes or use regression")
    for code in present:
        if problem := class_name_problem(names[code]):
            row = int(np.argmax(codes == code))
            raise DatasetRejected(
                f"row {row + 1}, column '{name}' is {_label_shown(names[code])}: a class name {problem}; "
                "fix or drop the row (class names are shown in terminals and the dashboard)",
                f"row {row + 1}",
            )
    index = np.full(len(names), -1, dtype=np.int64)
    index[present] = np.arange(len(present))
    y = index[codes]
    unknown = np.flatnonzero(test & (y < 0))
    if len(unknown):
        row = int(unknown[0])
        raise DatasetRejected(
            f"row {row + 1}, column '{name}' is {_label_shown(names[codes[row]])}, a class no train row has: "
            "every test class must also appear in the train split",
            f"row {row + 1}",
        )
    check_classes(len(present), y[train], f"column '{name}'", limits)
    return y.astype(np.int32), [names[code] for code in present]


def _label_shown(name: str) -> str:
    """A label for a message: a whole number as it is, text quoted and escaped."""
    return name if WHOLE_NUMBER.fullmatch(name) else shown(name)


def _class_codes(column: pa.ChunkedArray, name: str) -> tuple[list[str], np.ndarray]:
    """(every distinct label's name, sorted: numbers by value, text by code point; for each
    row the index of its label's name)."""
    column = _decoded(column)
    type_ = column.type
    if pa.types.is_integer(type_) or pa.types.is_floating(type_):
        values = column.to_numpy()  # uint64 stays uint64: 2**64 - 1 is not -1
        if pa.types.is_floating(type_):
            bad = np.flatnonzero(~np.isfinite(values) | (values != np.round(values)))
            if len(bad):
                row = int(bad[0])
                raise DatasetRejected(
                    f"row {row + 1}, column '{name}' is {values[row]}: class labels must be whole numbers or text "
                    "(class names); for a numeric target pass task='regression'",
                    f"row {row + 1}",
                )
        distinct, codes = np.unique(values, return_inverse=True)
        return [str(int(value)) for value in distinct.tolist()], codes.reshape(-1).astype(np.int64)
    if _is_text(type_) or pa.types.is_boolean(type_):
        values, codes = _distinct(_as_text(column), name)
        order = sorted(range(len(values)), key=lambda i: str(values[i]))
        rank = np.empty(len(values), dtype=np.int64)
        rank[order] = np.arange(len(values))
        return [str(values[i]) for i in order], rank[codes]
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
    y = to_float32(_decoded(column).to_numpy())
    bad = np.flatnonzero(~np.isfinite(y))
    if len(bad):
        row = int(bad[0])
        raise DatasetRejected(
            f"row {row + 1}, column '{name}' is {column[row].as_py()}: regression targets must be finite numbers "
            "(within float32's range)",
            f"row {row + 1}",
        )
    return y
