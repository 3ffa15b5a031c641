"""Datasets as numpy arrays, the same for both frameworks.

Every dataset comes out as flat float32 features (the built-in ones in [0, 1]) and int32 class
labels (or float32 regression targets), split into train and test, limited to the first
`train_limit`/`test_limit` examples of each split. Uploaded datasets are read from the file a
worker fetched (trainers/dataset_file.py).

MNIST-format data (`mnist`, `fashion-mnist`) is read from IDX files (gzip-compressed or raw),
looked up in this order:

1. the caller's `data_dir` (a worker's TRAINHUB_DATA_DIR, passed in RunOptions): its dataset
   folders (`fashion-mnist/`, `FashionMNIST/raw/` or `mnist/`, `MNIST/raw/`, the latter as
   torchvision lays them out), then the folder itself;
2. where the OS keeps it: `/usr/share/datasets/<name>` (Debian's `dataset-fashion-mnist`);
3. a torchvision download into `data_dir`, or `~/.cache/trainhub/data` when there is none.

This module imports numpy (and scikit-learn for `digits`) only; torchvision is imported only
when a download is attempted.
"""

from __future__ import annotations

import functools
import gzip
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from trainers import dataset_file as stored
from trainers.spec import BUILT_IN, DatasetSpec, held_out

log = logging.getLogger(__name__)


class DataNotFound(Exception):
    """The dataset's files are nowhere to be found and could not be downloaded.

    `str()` is for the job's user (what to ask for, no server paths); `detail` is for the
    worker's log (where it looked)."""

    def __init__(self, message: str, detail: str = "") -> None:
        super().__init__(message)
        self.detail = detail


@dataclass
class Dataset:
    """A dataset split into train and test, as the models see it.

    x_train: float32 [N, D] (images flattened in (row, column, channel) order); y_train: int32
    [N] in [0, num_classes) for classification, float32 [N] targets for regression.
    x_test: float32 [M, D]; y_test: [M]. input_shape: one example's shape ([D] or [H, W, C]).
    mean, std: float32 [D], the training examples' moments the features were standardized with
    (None when they were not). uploaded: read from a user's dataset file. Arrays may be read-only
    views of a cache shared by every job of the process: copy before writing to them.
    """

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...] = ()
    task: str = "classification"
    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    uploaded: bool = False
    scale: float = 1.0  # what the raw values were multiplied by (1/255 for uploaded uint8 images)

    @property
    def in_features(self) -> int:
        return self.x_train.shape[1]

    @property
    def outputs(self) -> int:
        """The model's output units: a logit per class, or one predicted value."""
        return self.num_classes if self.task == "classification" else 1


VALIDATION_SEED = 0  # the validation split's shuffle: fixed, so every job of a dataset holds out the same examples


def load_dataset(spec: DatasetSpec, data_dir: Path | None = None, dataset_file: Path | None = None) -> Dataset:
    """Load the dataset `spec` names, hold out `validation_split`, keep the first
    `train_limit`/`test_limit` examples of each split and standardize when `spec` says so.

    An uploaded dataset (`spec.id`) is read from `dataset_file` (trainers.dataset_file's form).
    Raises DataNotFound for mnist/fashion-mnist when the IDX files are neither in `data_dir`
    nor in the OS location and cannot be downloaded, or for an uploaded dataset without its file.
    """
    full = _full_dataset(spec, data_dir, dataset_file)
    if spec.validation_split is not None:
        full = _hold_out(full, spec.validation_split)
    data = replace(
        full,
        x_train=full.x_train[: spec.train_limit],
        y_train=full.y_train[: spec.train_limit],
        x_test=full.x_test[: spec.test_limit],
        y_test=full.y_test[: spec.test_limit],
    )
    if not spec.uses_standardize:
        return data
    mean, std = stored.moments(data.x_train)
    return replace(
        data,
        x_train=stored.standardize(data.x_train, mean, std),
        x_test=stored.standardize(data.x_test, mean, std),
        mean=mean,
        std=std,
    )


def _full_dataset(spec: DatasetSpec, data_dir: Path | None, dataset_file: Path | None) -> Dataset:
    if spec.name == "synthetic":
        # Generated at exactly the requested size; the first N examples do not depend on it.
        return _synthetic(spec.train_limit or SYNTHETIC_TRAIN, spec.test_limit or SYNTHETIC_TEST)
    if spec.name == "digits":
        return _digits(str(download_dir(data_dir)))
    if spec.name is not None:
        return _mnist_format(spec.name, data_dir)
    if dataset_file is None or not dataset_file.is_file():
        raise DataNotFound(f"dataset {spec.id} was not fetched to this worker", f"dataset_file {dataset_file}")
    return _uploaded(dataset_file)


def _uploaded(path: Path) -> Dataset:
    arrays = stored.read(path)
    empty = arrays.x_train[:0]
    x_test = arrays.x_test if arrays.x_test is not None else empty
    y_test = arrays.y_test if arrays.y_test is not None else arrays.y_train[:0]
    return Dataset(
        x_train=stored.features(arrays.x_train),
        y_train=arrays.y_train,
        x_test=stored.features(x_test),
        y_test=y_test,
        num_classes=arrays.num_classes,
        input_shape=tuple(arrays.input_shape),
        task=arrays.task,
        uploaded=True,
        scale=1 / 255 if arrays.is_image else 1.0,
    )


def _hold_out(full: Dataset, validation_split: float) -> Dataset:
    """The training split less `held_out` examples chosen by a fixed shuffle, which become the
    test split (an uploaded test split is then not used). Both keep the training split's order."""
    n = len(full.x_train)
    order = np.random.default_rng(VALIDATION_SEED).permutation(n)
    count = held_out(n, validation_split)
    held, kept = np.sort(order[:count]), np.sort(order[count:])
    return replace(
        full,
        x_train=full.x_train[kept],
        y_train=full.y_train[kept],
        x_test=full.x_train[held],
        y_test=full.y_train[held],
    )


# --- MNIST-format IDX files -------------------------------------------------------------

IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}

_DATA_SUBDIRS = {"fashion-mnist": ["fashion-mnist", "FashionMNIST/raw"], "mnist": ["mnist", "MNIST/raw"]}
_OS_DIRS = {"fashion-mnist": "/usr/share/datasets/fashion-mnist", "mnist": "/usr/share/datasets/mnist"}
_APT_PACKAGES = {"fashion-mnist": "dataset-fashion-mnist"}  # Debian packages no MNIST
_TORCHVISION_CLASSES = {"fashion-mnist": "FashionMNIST", "mnist": "MNIST"}


def installed_built_ins(data_dir: Path | None = None) -> list[str]:
    """The built-in datasets this process can load without a download: MNIST-format ones whose
    files are in `data_dir` or the OS location, and those generated or bundled (digits, synthetic)."""
    found = [name for name in _DATA_SUBDIRS if _find_idx_folder(name, data_dir) is not None]
    return [*found, "digits", "synthetic"]


def download_dir(data_dir: Path | None) -> Path:
    """Where datasets are downloaded: `data_dir`, or ~/.cache/trainhub/data when there is none."""
    return data_dir if data_dir else Path.home() / ".cache" / "trainhub" / "data"


def _mnist_format(name: str, data_dir: Path | None) -> Dataset:
    folder = _find_idx_folder(name, data_dir)
    if folder is None:
        _download(name, download_dir(data_dir))
        folder = _find_idx_folder(name, data_dir)
    if folder is None:
        raise DataNotFound(_not_found_message(name), _looked_in(name, data_dir))
    arrays = {key: _read_idx_file(folder, stem) for key, stem in IDX_FILES.items()}
    return Dataset(
        x_train=arrays["x_train"],
        y_train=arrays["y_train"],
        x_test=arrays["x_test"],
        y_test=arrays["y_test"],
        num_classes=10,
        input_shape=BUILT_IN[name].input_shape,
    )


def _candidate_folders(name: str, data_dir: Path | None) -> list[Path]:
    if data_dir:
        # The dataset's own folders first: the bare root may hold the other dataset's files.
        return [data_dir / sub for sub in _DATA_SUBDIRS[name]] + [data_dir, Path(_OS_DIRS[name])]
    # Without a data dir, an earlier download may sit in the cache folder.
    return [Path(_OS_DIRS[name]), download_dir(None) / _DATA_SUBDIRS[name][1]]


def _find_idx_folder(name: str, data_dir: Path | None) -> Path | None:
    for folder in _candidate_folders(name, data_dir):
        if all(_idx_path(folder, stem) is not None for stem in IDX_FILES.values()):
            return folder
    return None


def _idx_path(folder: Path, stem: str) -> Path | None:
    for candidate in (folder / stem, folder / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _download(name: str, root: Path) -> None:
    """Download with torchvision into `root`; failures are left for the caller to report."""
    try:
        from torchvision import datasets  # lazy: heavy, and absent from the API image
    except ImportError:
        return
    dataset_class = getattr(datasets, _TORCHVISION_CLASSES[name])
    try:
        root.mkdir(parents=True, exist_ok=True)
        for train in (True, False):
            dataset_class(str(root), train=train, download=True)
    except (OSError, RuntimeError):  # offline, read-only disk, bad checksum
        return


def _not_found_message(name: str) -> str:
    """What the job's user is told: how the worker's operator gets the data (no server paths)."""
    files = ", ".join(f"{stem}[.gz]" for stem in IDX_FILES.values())
    ways = [
        f"put its IDX files ({files}) into the folder TRAINHUB_DATA_DIR names, under {_DATA_SUBDIRS[name][0]}/",
        'download them where there is internet access with `python -c "from torchvision import '
        f"datasets; datasets.{_TORCHVISION_CLASSES[name]}('DIR', download=True)\"` and set "
        "TRAINHUB_DATA_DIR=DIR",
    ]
    if name in _APT_PACKAGES:
        ways.insert(0, f"on Debian or Ubuntu, `apt-get install {_APT_PACKAGES[name]}`")
    return (
        f"dataset {name!r} is not installed on this worker and could not be downloaded; the worker's "
        "operator can install it: " + "; or ".join(ways) + ". The worker's log says where it looked."
    )


def _looked_in(name: str, data_dir: Path | None) -> str:
    """Where the files were looked for, for the worker's log."""
    looked_in = ", ".join(str(folder) for folder in _candidate_folders(name, data_dir))
    return f"dataset {name!r}: looked in {looked_in}; downloads go to {download_dir(data_dir)}"


def _read_idx_file(folder: Path, stem: str) -> np.ndarray:
    path = _idx_path(folder, stem)
    assert path is not None  # _find_idx_folder chose `folder` because it holds every file
    path = path.resolve()
    stat = path.stat()
    # The modification time and size are in the key so a replaced file is read again.
    return _parse_idx_cached(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _parse_idx_cached(path: str, mtime_ns: int, size: int) -> np.ndarray:
    array = parse_idx(Path(path))
    if array.ndim > 1:
        # Images: flatten to [N, rows*cols] and scale to [0, 1] once per process, not per job; one
        # pass (astype then divide was two, 4x the time: a fresh worker's first job waited for it).
        array = np.divide(array.reshape(len(array), -1), np.float32(255), dtype=np.float32)
    else:
        array = array.astype(np.int32)
    array.setflags(write=False)  # shared by every job of the process
    return array


_IDX_DTYPES: dict[int, type[np.generic] | str] = {
    0x08: np.uint8,
    0x09: np.int8,
    0x0B: ">i2",
    0x0C: ">i4",
    0x0D: ">f4",
    0x0E: ">f8",
}


def parse_idx(path: Path) -> np.ndarray:
    """Parse an IDX file (yann.lecun.com/exdb/mnist format), gzip-compressed or raw.

    The header is two zero bytes, a type byte, the number of dimensions, then each dimension
    as a big-endian uint32. Returns an array of that shape in the file's type (uint8 for
    MNIST). Raises ValueError when the file is not IDX or is truncated.
    """
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an IDX file")
    ndim = raw[3]
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    offset = 4 + 4 * ndim
    count = int(np.prod(shape))
    if len(raw) < offset + count * dtype.itemsize:
        raise ValueError(f"{path} is truncated: expected shape {shape}")
    return np.frombuffer(raw, dtype=dtype, count=count, offset=offset).reshape(shape)


# --- digits and synthetic -----------------------------------------------------------------

DIGITS_TEST = 360  # 20% of scikit-learn's 1797 digits; 1437 remain for training
DIGITS_SPLIT_SEED = 0  # fixed, so the split is the same whatever the job's seed


@functools.lru_cache(maxsize=1)
def _digits(cache_dir: str) -> Dataset:
    """scikit-learn's digits, split as DIGITS_SPLIT_SEED says; the split is kept in `cache_dir`
    (digits-<scikit-learn version>.npz) so a fresh worker's first digits job does not import
    scikit-learn (~1-2 s). A cache that cannot be read or written is only skipped."""
    from importlib.metadata import version

    cache = Path(cache_dir) / f"digits-{version('scikit-learn')}-{DIGITS_SPLIT_SEED}-{DIGITS_TEST}.npz"
    try:
        with np.load(cache) as stored:
            arrays = [stored[name] for name in ("x_train", "x_test", "y_train", "y_test")]
    except (OSError, KeyError, ValueError):
        arrays = _split_digits()
        _keep(cache, dict(zip(("x_train", "x_test", "y_train", "y_test"), arrays, strict=True)))
    x_train, x_test, y_train, y_test = arrays
    for array in arrays:
        array.setflags(write=False)
    return Dataset(x_train, y_train, x_test, y_test, num_classes=10, input_shape=BUILT_IN["digits"].input_shape)


def _split_digits() -> list[np.ndarray]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)  # pixel intensities are 0..16
    y = digits.target.astype(np.int32)
    return train_test_split(x, y, test_size=DIGITS_TEST, random_state=DIGITS_SPLIT_SEED, stratify=y)


def _keep(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """Write `arrays` to `path` whole or not at all (a temporary file renamed: another worker may
    be reading it); an unwritable folder only leaves it unwritten."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open(partial, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub takes the names for its flags
        os.replace(partial, path)
    except OSError as exc:
        log.info("digits not cached in %s: %s", path.parent, exc)


SYNTHETIC_TRAIN = 10000
SYNTHETIC_TEST = 2000
SYNTHETIC_FEATURES = 784
SYNTHETIC_CLASSES = 10


def _synthetic(n_train: int, n_test: int) -> Dataset:
    """Uniform features labelled by a fixed random linear teacher: learnable, deterministic."""
    teacher = np.random.default_rng(12345).standard_normal((SYNTHETIC_FEATURES, SYNTHETIC_CLASSES), dtype=np.float32)

    def split(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        # Rows are drawn one after another, so the first k rows are the same for every n >= k.
        x = np.random.default_rng(seed).random((n, SYNTHETIC_FEATURES), dtype=np.float32)
        y = np.argmax((x - 0.5) @ teacher, axis=1).astype(np.int32)
        return x, y

    x_train, y_train = split(1, n_train)
    x_test, y_test = split(2, n_test)
    return Dataset(
        x_train, y_train, x_test, y_test, num_classes=SYNTHETIC_CLASSES, input_shape=BUILT_IN["synthetic"].input_shape
    )
