import gzip
from pathlib import Path

import numpy as np
import pytest

from trainers import data
from trainers.data import DataNotFound, load_dataset, parse_idx
from trainers.spec import DatasetSpec

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    raw = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


def write_mnist_files(folder: Path, n_train: int, n_test: int, compress: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrays = {
        "x_train": rng.integers(0, 256, (n_train, 28, 28)),
        "y_train": rng.integers(0, 10, n_train),
        "x_test": rng.integers(0, 256, (n_test, 28, 28)),
        "y_test": rng.integers(0, 10, n_test),
    }
    folder.mkdir(parents=True, exist_ok=True)
    for key, stem in data.IDX_FILES.items():
        write_idx(folder / (f"{stem}.gz" if compress else stem), arrays[key], compress)
    return arrays


@pytest.mark.skipif(not DEBIAN_FASHION.is_dir(), reason="needs Debian's dataset-fashion-mnist")
def test_fashion_mnist_from_the_debian_files(monkeypatch):
    monkeypatch.delenv("TRAINHUB_DATA_DIR", raising=False)
    full = load_dataset(DatasetSpec(name="fashion-mnist"))
    assert full.x_train.shape == (60000, 784) and full.x_test.shape == (10000, 784)
    assert full.x_train.dtype == np.float32 and full.y_train.dtype == np.int32
    assert 0.0 <= full.x_train.min() and full.x_train.max() <= 1.0 and full.x_train.max() > 0.99
    assert set(np.unique(full.y_train)) == set(range(10)) and full.num_classes == 10

    limited = load_dataset(DatasetSpec(name="fashion-mnist", train_limit=2000, test_limit=500))
    assert limited.x_train.shape == (2000, 784) and limited.y_test.shape == (500,)
    np.testing.assert_array_equal(limited.x_train, full.x_train[:2000])


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_idx_files_in_the_data_dir(tmp_path, monkeypatch, compress):
    monkeypatch.setenv("TRAINHUB_DATA_DIR", "/nowhere")  # the environment is not read: only data_dir
    arrays = write_mnist_files(tmp_path / "MNIST" / "raw", 30, 10, compress)

    dataset = load_dataset(DatasetSpec(name="mnist", train_limit=20), data_dir=tmp_path)

    assert dataset.x_train.shape == (20, 784) and dataset.x_test.shape == (10, 784)
    np.testing.assert_allclose(dataset.x_train, arrays["x_train"][:20].reshape(20, 784) / 255.0, rtol=1e-6)
    np.testing.assert_array_equal(dataset.y_test, arrays["y_test"])


def test_parse_idx_rejects_other_files(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte"
    path.write_bytes(b"not an idx file")
    with pytest.raises(ValueError, match="not an IDX file"):
        parse_idx(path)


def test_missing_mnist_says_how_to_get_it(tmp_path, monkeypatch):
    if Path(data._OS_DIRS["mnist"]).is_dir():
        pytest.skip("MNIST is installed on this machine")
    attempts = []
    # Stand in for torchvision offline, so the test neither depends on nor uses the network.
    monkeypatch.setattr(data, "_download", lambda name, root: attempts.append((name, root)))

    with pytest.raises(DataNotFound) as raised:
        load_dataset(DatasetSpec(name="mnist"), data_dir=tmp_path)

    assert attempts == [("mnist", tmp_path)]
    message = str(raised.value)
    assert "TRAINHUB_DATA_DIR" in message and "train-images-idx3-ubyte" in message and "datasets.MNIST(" in message
    # The user is told what to do, never the worker's paths; the log (detail) says where it looked.
    assert str(tmp_path) not in message and "/" not in message.split("(")[0]
    assert str(tmp_path) in raised.value.detail


def test_missing_fashion_mnist_names_the_debian_package(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_OS_DIRS", {**data._OS_DIRS, "fashion-mnist": str(tmp_path / "none")})
    monkeypatch.setattr(data, "_download", lambda name, root: None)

    with pytest.raises(DataNotFound, match="apt-get install dataset-fashion-mnist"):
        load_dataset(DatasetSpec(name="fashion-mnist"), data_dir=tmp_path)


def test_digits_split_is_fixed():
    first = load_dataset(DatasetSpec(name="digits"))
    again = load_dataset(DatasetSpec(name="digits"))
    assert first.x_train.shape == (1437, 64) and first.x_test.shape == (360, 64)
    assert first.x_train.dtype == np.float32 and first.y_train.dtype == np.int32
    assert first.x_train.min() == 0.0 and first.x_train.max() == 1.0
    np.testing.assert_array_equal(first.y_test, again.y_test)
    assert load_dataset(DatasetSpec(name="digits", train_limit=100)).x_train.shape == (100, 64)


def test_synthetic_is_deterministic_and_labelled_by_a_teacher():
    small = load_dataset(DatasetSpec(name="synthetic", train_limit=500, test_limit=100))
    large = load_dataset(DatasetSpec(name="synthetic", train_limit=1000))
    assert small.x_train.shape == (500, 784) and small.x_test.shape == (100, 784)
    assert large.x_test.shape == (2000, 784)
    np.testing.assert_array_equal(small.x_train, large.x_train[:500])
    np.testing.assert_array_equal(small.y_test, large.y_test[:100])
    assert len(np.unique(large.y_train)) == 10
    assert load_dataset(DatasetSpec(name="synthetic")).x_train.shape == (10000, 784)


def test_cached_arrays_are_read_only():
    dataset = load_dataset(DatasetSpec(name="digits"))
    with pytest.raises(ValueError):
        dataset.x_train[0, 0] = 1.0
