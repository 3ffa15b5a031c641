"""app/datasets: uploads read into DatasetArrays, on real data nobody here made (scikit-learn's
breast cancer, diabetes and digits; Debian's Fashion-MNIST), and each way an upload is refused.
No database, no network."""

from __future__ import annotations

import gzip
import io
import json
import struct
import tarfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pv
import pyarrow.parquet as pq
import pytest
from PIL import Image
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits

from app.datasets.formats import (
    DatasetRejected,
    UploadLimits,
    UploadOptions,
    detect_format,
    parse_upload,
)
from trainers import dataset_file
from trainers.data import parse_idx

FASHION = Path("/usr/share/datasets/fashion-mnist")
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
needs_fashion = pytest.mark.skipif(
    not (FASHION / "train-images-idx3-ubyte.gz").exists(), reason="apt-get install dataset-fashion-mnist"
)


def parse(path: Path, limits: UploadLimits = UploadLimits(), **options: object) -> dataset_file.DatasetArrays:
    return parse_upload(path, UploadOptions(**options), limits)  # type: ignore[arg-type]


def rejected(path: Path, status: int = 422, limits: UploadLimits = UploadLimits(), **options: object) -> str:
    """The message of the DatasetRejected that parsing `path` raises, after checking its status."""
    with pytest.raises(DatasetRejected) as caught:
        parse(path, limits, **options)
    assert caught.value.status == status, caught.value.message
    return caught.value.message


def write_table(path: Path, columns: dict[str, object]) -> Path:
    table = pa.table(columns)
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    else:
        pv.write_csv(table, path)
    return path


def write_zip(path: Path, members: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> Path:
    with zipfile.ZipFile(path, "w", compression) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def breast_cancer_columns() -> dict[str, object]:
    data = load_breast_cancer()
    columns: dict[str, object] = {name: data.data[:, j] for j, name in enumerate(data.feature_names)}
    columns["label"] = data.target
    return columns


# --- real data --------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_breast_cancer_table(tmp_path: Path, suffix: str) -> None:
    source = load_breast_cancer()
    path = write_table(tmp_path / f"cancer{suffix}", breast_cancer_columns())

    data = parse(path, filename=f"cancer{suffix}")

    assert data.x_train.shape == (569, 30) and data.x_train.dtype == np.float32
    np.testing.assert_array_equal(data.x_train, source.data.astype(np.float32))
    assert data.task == "classification" and data.class_names == ["0", "1"]
    assert data.y_train.dtype == np.int32
    np.testing.assert_array_equal(np.bincount(data.y_train), np.bincount(source.target))  # 212 malignant, 357 benign
    assert data.x_test is None and data.y_test is None
    assert data.source_format == suffix[1:]


def test_parquet_with_text_labels_and_a_split_column(tmp_path: Path) -> None:
    source = load_breast_cancer()
    columns = breast_cancer_columns()
    columns["label"] = source.target_names[source.target]  # "malignant" / "benign"
    columns["split"] = np.where(np.arange(569) < 469, "train", "test")
    path = write_table(tmp_path / "cancer.parquet", columns)

    data = parse(path)

    assert data.class_names == ["benign", "malignant"]
    assert data.x_train.shape == (469, 30) and data.x_test is not None and data.x_test.shape == (100, 30)
    labels = np.concatenate([data.y_train, data.y_test])
    np.testing.assert_array_equal(np.array(data.class_names)[labels], source.target_names[source.target])


def test_diabetes_csv_regression(tmp_path: Path) -> None:
    source = load_diabetes()
    columns: dict[str, object] = {name: source.data[:, j] for j, name in enumerate(source.feature_names)}
    columns["target"] = source.target
    path = write_table(tmp_path / "diabetes.csv", columns)

    # The targets are whole numbers (151.0 is written "151"), so the task is said, not guessed.
    data = parse(path, label_column="target", task="regression")

    assert data.task == "regression" and data.class_names == [] and data.num_classes == 0
    assert data.x_train.shape == (442, 10)
    assert data.y_train.dtype == np.float32
    np.testing.assert_array_equal(data.y_train, source.target.astype(np.float32))


def fashion_members() -> dict[str, bytes]:
    """The four real .gz files, inside folders as a user's archive would have them."""
    return {f"fashion/raw/{name}.gz": (FASHION / f"{name}.gz").read_bytes() for name in IDX_FILES}


def check_fashion(data: dataset_file.DatasetArrays) -> None:
    expected = {name: parse_idx(FASHION / f"{name}.gz") for name in IDX_FILES}
    assert data.x_train.shape == (60000, 28, 28, 1) and data.x_train.dtype == np.uint8
    np.testing.assert_array_equal(data.x_train[..., 0], expected["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(data.y_train, expected["train-labels-idx1-ubyte"])
    assert data.x_test is not None and data.x_test.shape == (10000, 28, 28, 1)
    np.testing.assert_array_equal(data.x_test[..., 0], expected["t10k-images-idx3-ubyte"])
    np.testing.assert_array_equal(data.y_test, expected["t10k-labels-idx1-ubyte"])
    assert data.class_names == [str(c) for c in range(10)] and data.task == "classification"
    assert data.y_train.dtype == np.int32 and data.source_format == "idx"


@needs_fashion
def test_fashion_mnist_idx_in_a_zip(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "upload", fashion_members())
    assert detect_format(path, UploadOptions()) == "idx"
    check_fashion(parse(path))


@needs_fashion
def test_fashion_mnist_idx_in_a_tar_gz(tmp_path: Path) -> None:
    path = tmp_path / "fashion.tar.gz"
    with tarfile.open(path, "w:gz", compresslevel=1) as archive:
        for name in IDX_FILES:
            archive.add(FASHION / f"{name}.gz", arcname=f"fashion/{name}.gz")
    assert detect_format(path, UploadOptions()) == "idx"
    check_fashion(parse(path))


def digits_zip(path: Path, test_from: int = 1500, wrap: str = "digits/") -> Path:
    """scikit-learn's 8x8 digits as PNGs in ImageFolder layout (0..16 scaled to 0..255)."""
    digits = load_digits()
    pixels = np.round(digits.images * 255 / 16).astype(np.uint8)
    members = {}
    for i, (image, label) in enumerate(zip(pixels, digits.target)):
        split = "train" if i < test_from else "test"
        members[f"{wrap}{split}/{label}/{i:04d}.png"] = png(image)
    return write_zip(path, members)


def test_digits_imagefolder_zip(tmp_path: Path) -> None:
    digits = load_digits()
    pixels = np.round(digits.images * 255 / 16).astype(np.uint8)
    path = digits_zip(tmp_path / "digits.zip")

    data = parse(path, filename="digits.zip")

    assert data.source_format == "imagefolder" and data.class_names == [str(c) for c in range(10)]
    assert data.x_train.shape == (1500, 8, 8, 1) and data.x_train.dtype == np.uint8
    assert data.x_test is not None and data.x_test.shape == (297, 8, 8, 1)
    # Images come class by class, by file name within a class.
    train_order = sorted(range(1500), key=lambda i: (str(digits.target[i]), i))
    np.testing.assert_array_equal(data.x_train[..., 0], pixels[train_order])
    np.testing.assert_array_equal(data.y_train, digits.target[train_order])
    test_order = sorted(range(1500, 1797), key=lambda i: (str(digits.target[i]), i))
    np.testing.assert_array_equal(data.y_test, digits.target[test_order])


def test_imagefolder_resize_and_colour(tmp_path: Path) -> None:
    grey = np.full((8, 8), 100, dtype=np.uint8)
    red = np.zeros((6, 10, 3), dtype=np.uint8)
    red[..., 0] = 255
    path = write_zip(tmp_path / "up.zip", {"train/a/1.png": png(grey), "train/b/2.png": png(red)})

    data = parse(path, image_size=(4, 5))

    assert data.x_train.shape == (2, 4, 5, 3)  # one colour image makes all RGB
    np.testing.assert_array_equal(data.x_train[0], np.full((4, 5, 3), 100))
    np.testing.assert_array_equal(data.x_train[1, ..., 0], np.full((4, 5), 255))


def test_npz_round_trip_through_the_stored_form(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(20, 5, 4), dtype=np.uint8)
    labels = np.arange(20) % 3
    path = tmp_path / "up.npz"
    np.savez(path, x_train=images[:15], y_train=labels[:15], x_test=images[15:], y_test=labels[15:])

    data = parse(path)
    dataset_file.write(tmp_path / "stored", data)
    stored = dataset_file.read(tmp_path / "stored")

    assert data.x_train.shape == (15, 5, 4, 1) and data.class_names == ["0", "1", "2"]
    np.testing.assert_array_equal(stored.x_train[..., 0], images[:15])
    np.testing.assert_array_equal(stored.y_test, labels[15:])
    assert stored.task == "classification" and stored.source_format == "npz"


def test_npz_table_regression(tmp_path: Path) -> None:
    x = np.arange(12, dtype=np.float64).reshape(6, 2)
    y = np.linspace(0.0, 1.0, 6)
    path = tmp_path / "up.npz"
    np.savez_compressed(path, x_train=x, y_train=y)

    data = parse(path)

    assert data.task == "regression" and data.x_train.dtype == np.float32 and data.input_shape == [2]
    np.testing.assert_array_equal(data.y_train, y.astype(np.float32))


def test_detect_format(tmp_path: Path) -> None:
    csv = write_table(tmp_path / "noext", {"a": [1, 2], "label": [0, 1]})
    parquet = write_table(tmp_path / "t.parquet", {"a": [1, 2], "label": [0, 1]})
    npz = tmp_path / "a.npz"
    np.savez(npz, x_train=np.zeros((2, 2)), y_train=np.zeros(2))

    assert detect_format(csv, UploadOptions()) == "csv"
    assert detect_format(parquet, UploadOptions(filename="whatever.bin")) == "parquet"
    assert detect_format(npz, UploadOptions(filename="C:\\Users\\me\\upload.zip")) == "npz"
    assert detect_format(csv, UploadOptions(format="csv")) == "csv"
    assert detect_format(npz, UploadOptions(format="npz", filename="data.csv")) == "npz"  # the format beats the name


# --- refusals ---------------------------------------------------------------------------------


def test_zip_bomb_by_declared_size(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "bomb.zip", {"train-images-idx3-ubyte": bytes(2_000_000)}, zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 20_000

    message = rejected(path, 413, UploadLimits(max_unpacked_bytes=1_000_000))
    assert "archive" in message and "1,000,000" in message and "zip bomb" in message
    assert "TRAINHUB_MAX_DATASET_UNPACKED_BYTES" in message


def test_gzip_bomb_inside_an_archive_is_cut_off_while_reading(tmp_path: Path) -> None:
    bomb = gzip.compress(bytes(2_000_000))
    path = write_zip(tmp_path / "bomb.zip", {"train-images-idx3-ubyte.gz": bomb, "train-labels-idx1-ubyte": b""})

    message = rejected(path, 413, UploadLimits(max_unpacked_bytes=1_000_000))
    assert "train-images-idx3-ubyte.gz" in message and "TRAINHUB_MAX_DATASET_UNPACKED_BYTES" in message


def test_tar_gz_bomb_is_cut_off_while_streaming(tmp_path: Path) -> None:
    path = tmp_path / "bomb.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        member = tarfile.TarInfo("train-images-idx3-ubyte")
        member.size = 2_000_000
        archive.addfile(member, io.BytesIO(bytes(member.size)))
    assert path.stat().st_size < 20_000

    message = rejected(path, 413, UploadLimits(max_unpacked_bytes=1_000_000))
    assert "train-images-idx3-ubyte" in message and "1,000,000" in message


def test_too_many_archive_members(tmp_path: Path) -> None:
    path = write_zip(tmp_path / "many.zip", {f"train/a/{i}.png": b"" for i in range(5)})
    message = rejected(path, 413, UploadLimits(max_files=3))
    assert "members" in message and "TRAINHUB_MAX_DATASET_FILES" in message


def test_npz_object_array(tmp_path: Path) -> None:
    path = tmp_path / "pickled.npz"
    np.savez(path, x_train=np.array([{"a": 1}, None], dtype=object), y_train=np.array([0, 1]))

    message = rejected(path)
    assert "x_train" in message and "object" in message and "pickle" in message


def test_npz_unknown_array(tmp_path: Path) -> None:
    path = tmp_path / "up.npz"
    np.savez(path, x_train=np.zeros((2, 2)), y_train=np.array([0, 1]), weights=np.zeros(3))

    message = rejected(path)
    assert "weights" in message and "x_train, y_train, x_test, y_test" in message


def test_npz_float_images(tmp_path: Path) -> None:
    path = tmp_path / "up.npz"
    np.savez(path, x_train=np.zeros((2, 4, 4), dtype=np.float32), y_train=np.array([0, 1]))
    assert "uint8" in rejected(path) and "[N, D]" in rejected(path)


def test_npz_lengths_differ(tmp_path: Path) -> None:
    path = tmp_path / "up.npz"
    np.savez(path, x_train=np.zeros((10, 2)), y_train=np.arange(9) % 2)
    message = rejected(path)
    assert "y_train has 9 labels" in message and "x_train has 10" in message


def test_npz_negative_class_index(tmp_path: Path) -> None:
    path = tmp_path / "up.npz"
    np.savez(path, x_train=np.zeros((4, 2)), y_train=np.array([0, 1, 2, -1]))
    assert "y_train row 3 is -1" in rejected(path)


def test_npz_infinite_feature(tmp_path: Path) -> None:
    x = np.zeros((4, 3))
    x[2, 1] = np.inf
    path = tmp_path / "up.npz"
    np.savez(path, x_train=x, y_train=np.array([0, 1, 0, 1]))
    assert "x_train row 2, feature 1 is inf" in rejected(path)


def test_npz_explicitly_empty_test_split(tmp_path: Path) -> None:
    path = tmp_path / "up.npz"
    np.savez(path, x_train=np.zeros((4, 2)), y_train=np.array([0, 1, 0, 1]), x_test=np.zeros((0, 2)), y_test=[])
    assert "x_test has no examples" in rejected(path)


def test_train_and_test_shapes_differ(tmp_path: Path) -> None:
    path = tmp_path / "up.npz"
    y = np.array([0, 1, 0, 1])
    np.savez(path, x_train=np.zeros((4, 3)), y_train=y, x_test=np.zeros((4, 4)), y_test=y)
    message = rejected(path)
    assert "x_test" in message and "[4]" in message and "[3]" in message and "same shape" in message


def test_csv_text_feature_column(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", {"age": [30, 40], "colour": ["red", "blue"], "label": [0, 1]})
    message = rejected(path)
    assert "column 'colour'" in message and "'red'" in message and "numeric" in message


def test_csv_column_of_numbers_with_one_text_value(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("age,label\n30,0\n40,1\n?,1\n")
    assert "row 3, column 'age' is '?', not a number" in rejected(path)


def test_csv_with_a_header_only(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("age,label\n")
    assert "the csv table has no examples" in rejected(path)


def test_csv_nan_feature(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("age,height,label\n30,1.8,0\n40,NaN,1\n50,1.7,1\n")
    assert "row 2, column 'height'" in rejected(path)


def test_parquet_nan_feature(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.parquet", {"a": [1.0, 2.0, float("nan")], "label": [0, 1, 1]})
    message = rejected(path)
    assert "row 3, column 'a' is nan" in message and "finite" in message


def test_fractional_class_label(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", {"a": [1, 2, 3], "label": [0.0, 1.5, 1.0]})
    message = rejected(path, task="classification")
    assert "row 2, column 'label' is 1.5" in message and "whole numbers" in message


def test_single_class(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", {"a": [1, 2, 3], "label": ["cat", "cat", "cat"]})
    assert "at least 2" in rejected(path)


def test_bad_split_value(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", {"a": [1, 2, 3], "label": [0, 1, 0], "split": ["train", "test", "valid"]})
    assert "row 3, column 'split' is 'valid'" in rejected(path)


def test_test_class_missing_from_train_table(tmp_path: Path) -> None:
    columns = {"a": [1, 2, 3, 4], "label": ["x", "y", "x", "z"], "split": ["train", "train", "test", "test"]}
    path = write_table(tmp_path / "t.csv", columns)
    assert "row 4, column 'label' is 'z'" in rejected(path)


def test_missing_label_column(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", {"a": [1, 2], "target": [0, 1]})
    message = rejected(path)
    assert "no column 'label'" in message and "label_column" in message


def test_too_many_examples(tmp_path: Path) -> None:
    path = write_table(tmp_path / "cancer.csv", breast_cancer_columns())
    message = rejected(path, 413, UploadLimits(max_examples=100))
    assert "569" in message and "100" in message and "TRAINHUB_MAX_DATASET_EXAMPLES" in message


def test_parquet_over_limit_from_metadata(tmp_path: Path) -> None:
    path = write_table(tmp_path / "cancer.parquet", breast_cancer_columns())
    assert "Parquet file" in rejected(path, 413, UploadLimits(max_examples=100))


def test_garbage_parquet(tmp_path: Path) -> None:
    path = tmp_path / "up.parquet"
    path.write_bytes(b"PAR1" + bytes(range(256)) * 4)
    assert "not a readable Parquet file" in rejected(path, filename="up.parquet")


@needs_fashion
def test_truncated_idx_gz(tmp_path: Path) -> None:
    labels = (FASHION / "t10k-labels-idx1-ubyte.gz").read_bytes()
    images = (FASHION / "t10k-images-idx3-ubyte.gz").read_bytes()
    members = {"train-images-idx3-ubyte.gz": images, "train-labels-idx1-ubyte.gz": labels[: len(labels) // 2]}
    path = write_zip(tmp_path / "up.zip", members)

    message = rejected(path)
    assert "train-labels-idx1-ubyte.gz" in message and "cut-off gzip" in message


def test_truncated_raw_idx(tmp_path: Path) -> None:
    images = struct.pack(">BBBBIII", 0, 0, 8, 3, 10, 28, 28) + bytes(28 * 28 * 5)  # 10 declared, 5 there
    labels = struct.pack(">BBBBI", 0, 0, 8, 1, 10) + bytes(10)
    path = write_zip(tmp_path / "up.zip", {"train-images-idx3-ubyte": images, "train-labels-idx1-ubyte": labels})

    message = rejected(path)
    assert "train-images-idx3-ubyte is cut off" in message and "[10, 28, 28]" in message


def test_corrupt_png(tmp_path: Path) -> None:
    good = png(np.zeros((4, 4), dtype=np.uint8))
    members = {"train/a/1.png": good, "train/b/2.png": good[:30] + b"garbage" * 10}
    message = rejected(write_zip(tmp_path / "up.zip", members))
    assert "train/b/2.png" in message and "not a readable PNG" in message


def test_images_of_different_sizes(tmp_path: Path) -> None:
    members = {"train/a/1.png": png(np.zeros((4, 4), np.uint8)), "train/b/2.png": png(np.zeros((5, 4), np.uint8))}
    message = rejected(write_zip(tmp_path / "up.zip", members))
    assert "train/b/2.png" in message and "pass image_size" in message


def test_test_class_missing_from_train_folder(tmp_path: Path) -> None:
    image = png(np.zeros((4, 4), np.uint8))
    members = {"train/a/1.png": image, "train/b/2.png": image, "test/c/3.png": image}
    message = rejected(write_zip(tmp_path / "up.zip", members))
    assert "test/c/3.png" in message and "class 'c'" in message


def test_image_over_the_pixel_cap(tmp_path: Path) -> None:
    image = png(np.zeros((64, 64), np.uint8))
    path = write_zip(tmp_path / "up.zip", {"train/a/1.png": image, "train/b/2.png": image})

    message = rejected(path, 413, UploadLimits(max_image_pixels=1000))
    assert "train/a/1.png" in message and "4,096 pixels" in message and "TRAINHUB_MAX_IMAGE_PIXELS" in message


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims width x height, with no pixel data: only its header can be read."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    chunk = struct.pack(">I", len(ihdr)) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    end = struct.pack(">I", 0) + b"IEND" + struct.pack(">I", zlib.crc32(b"IEND"))
    return b"\x89PNG\r\n\x1a\n" + chunk + end


def test_image_header_declaring_huge_size(tmp_path: Path) -> None:
    image = png(np.zeros((4, 4), np.uint8))
    path = write_zip(tmp_path / "up.zip", {"train/a/1.png": image, "train/b/2.png": png_header_only(100000, 100000)})
    assert "train/b/2.png" in rejected(path, 413)


def test_tar_with_a_symlink(tmp_path: Path) -> None:
    path = tmp_path / "up.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        link = tarfile.TarInfo("data/train-images-idx3-ubyte")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        archive.addfile(link)

    message = rejected(path, filename="up.tar.gz")
    assert "data/train-images-idx3-ubyte" in message and "link" in message


def test_unknown_format(tmp_path: Path) -> None:
    path = tmp_path / "paper"
    path.write_bytes(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n1 0 obj\n<< /Type /Catalog >>\nendobj\n")
    message = rejected(path, filename="paper.pdf")
    assert "'paper.pdf'" in message and "npz" in message and "imagefolder" in message


def test_unknown_options() -> None:
    with pytest.raises(DatasetRejected, match="unknown format 'xlsx'"):
        parse_upload(Path("/nonexistent"), UploadOptions(format="xlsx"))


# --- crafted sizes: what a few bytes may declare or decode to -----------------------------------


def npy_header(descr: str, shape: tuple[int, ...]) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array_header_1_0(out, {"descr": descr, "fortran_order": False, "shape": shape})
    return out.getvalue()


def npy(array: np.ndarray) -> bytes:
    out = io.BytesIO()
    np.lib.format.write_array(out, array)
    return out.getvalue()


def test_npz_header_declaring_more_than_its_member_holds(tmp_path: Path) -> None:
    # 1.46 TiB declared over 1000 bytes: np.load would allocate it all before reading.
    x_train = npy_header("<f8", (200000, 1000000)) + bytes(1000)
    members = {"x_train.npy": x_train, "y_train.npy": npy(np.array([0, 1]))}
    path = write_zip(tmp_path / "up.npz", members, zipfile.ZIP_DEFLATED)

    message = rejected(path)
    assert "x_train's header declares shape (200000, 1000000) = 1,600,000,000,128 bytes" in message
    assert f"the member holds {len(x_train):,}" in message


def test_npz_loaded_size_over_the_unpacked_limit(tmp_path: Path) -> None:
    path = tmp_path / "up.npz"
    np.savez(path, x_train=np.zeros((1000, 50), dtype=np.uint8), y_train=np.arange(1000) % 2)
    # 50,000 bytes stored, 200,000 more as float32 features.
    message = rejected(path, 413, UploadLimits(max_unpacked_bytes=200_000))
    assert "the npz's arrays" in message and "TRAINHUB_MAX_DATASET_UNPACKED_BYTES" in message


def test_parquet_decoded_size_is_bounded_not_its_encoded_size(tmp_path: Path) -> None:
    # Constant columns dictionary/run-length encode to a few bytes for any number of rows.
    rows = 200_000
    path = write_table(tmp_path / "t.parquet", {"a": np.zeros(rows), "b": np.ones(rows), "label": np.arange(rows) % 2})
    metadata = pq.ParquetFile(path).metadata
    encoded = sum(metadata.row_group(i).total_byte_size for i in range(metadata.num_row_groups))
    assert path.stat().st_size < 10_000 and encoded < 100_000

    message = rejected(path, 413, UploadLimits(max_unpacked_bytes=1_000_000))
    assert "Parquet file" in message and "200,000 rows x 3 columns" in message
    assert "1,000,000" in message and "TRAINHUB_MAX_DATASET_UNPACKED_BYTES" in message
    assert parse(path).x_train.shape == (rows, 2)  # within the default limit


def test_parquet_text_labels_are_bounded_as_a_dictionary(tmp_path: Path) -> None:
    # 100,000 rows of two 150-character names: 15 MB as plain strings, far less read as a
    # dictionary (how text columns are read), so a 5 MB limit holds them.
    rows = 100_000
    names = pa.array(["a" * 150, "b" * 150])
    labels = pa.DictionaryArray.from_arrays(pa.array(np.arange(rows) % 2, pa.int32()), names).cast(pa.string())
    path = write_table(tmp_path / "t.parquet", {"x": np.zeros(rows), "label": labels})

    data = parse(path, limits=UploadLimits(max_unpacked_bytes=5_000_000))
    assert data.class_names == ["a" * 150, "b" * 150]
    np.testing.assert_array_equal(data.y_train, np.arange(rows) % 2)


def test_csv_float32_features_bounded_by_the_unpacked_limit(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    columns = [f"f{j}" for j in range(50)]
    path.write_text(",".join([*columns, "label"]) + "\n" + "".join("0," * 50 + f"{i % 2}\n" for i in range(2000)))
    assert path.stat().st_size < 250_000  # 400,000 bytes as float32

    message = rejected(path, 413, UploadLimits(max_unpacked_bytes=300_000))
    assert "2,000 rows x 50 columns" in message and "TRAINHUB_MAX_DATASET_UNPACKED_BYTES" in message


# --- class names ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad", "code"),
    [("\x1b[2J\x1b[31mred", "U+001B"), ("bell\x07", "U+0007"), ("abc\u202egnp.exe", "U+202E"), ("a\x85b", "U+0085")],
)
@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_table_class_name_with_control_characters(tmp_path: Path, suffix: str, bad: str, code: str) -> None:
    path = write_table(tmp_path / f"t{suffix}", {"a": [1, 2, 3], "label": ["cat", "dog", bad]})
    message = rejected(path)
    assert "row 3, column 'label'" in message and code in message and "control character" in message
    assert bad not in message  # shown escaped


def test_table_class_name_too_long(tmp_path: Path) -> None:
    path = write_table(tmp_path / "t.csv", {"a": [1, 2, 3], "label": ["cat", "x" * 201, "cat"]})
    message = rejected(path)
    assert "row 2, column 'label'" in message and "201 characters" in message and "200" in message

    fine = write_table(tmp_path / "ok.csv", {"a": [1, 2, 3], "label": ["cat", "é" * 200, "cat"]})
    assert parse(fine).class_names == ["cat", "é" * 200]


def test_imagefolder_class_folder_with_control_characters(tmp_path: Path) -> None:
    image = png(np.zeros((4, 4), np.uint8))
    path = write_zip(tmp_path / "up.zip", {"train/a/1.png": image, "train/\x1b]0;pwned\x07/2.png": image})
    message = rejected(path)
    assert "'train/\\x1b]0;pwned\\x07/2.png'" in message and "U+001B" in message and "rename the folder" in message


def test_imagefolder_class_folder_name_too_long(tmp_path: Path) -> None:
    image = png(np.zeros((4, 4), np.uint8))
    path = write_zip(tmp_path / "up.zip", {"train/a/1.png": image, "test/" + "b" * 250 + "/2.png": image})
    message = rejected(path)
    assert "250 characters" in message and "rename the folder" in message


# --- no features ---------------------------------------------------------------------------------


def test_npz_with_no_features(tmp_path: Path) -> None:
    path = tmp_path / "up.npz"
    np.savez(path, x_train=np.ones((4, 0)), y_train=np.array([0, 1, 0, 1]))
    message = rejected(path)
    assert "x_train" in message and "needs at least one feature" in message


def test_image_arrays_with_no_pixels(tmp_path: Path) -> None:
    path = tmp_path / "up.npz"
    np.savez(path, x_train=np.zeros((4, 0, 5), dtype=np.uint8), y_train=np.array([0, 1, 0, 1]))
    assert "needs at least one feature" in rejected(path)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_table_with_only_a_label_and_an_index_column(tmp_path: Path, suffix: str) -> None:
    path = write_table(tmp_path / f"t{suffix}", {"__index_level_0__": [10, 11, 12], "label": [0, 1, 0]})
    assert "needs at least one feature" in rejected(path)


# --- pandas-written Parquet ----------------------------------------------------------------------


def pandas_parquet(path: Path, columns: dict[str, pa.Array], index_columns: list[object]) -> Path:
    """Parquet as pandas' to_parquet writes it: its metadata under b"pandas", index columns
    stored as columns (an unnamed one as __index_level_0__), categoricals as dictionaries."""
    table = pa.table(columns)
    metadata = {
        "index_columns": index_columns,
        "column_indexes": [],
        "columns": [{"name": name, "field_name": name, "metadata": None} for name in table.column_names],
        "creator": {"library": "pyarrow", "version": pa.__version__},
        "pandas_version": "2.2.0",
    }
    pq.write_table(table.replace_schema_metadata({b"pandas": json.dumps(metadata).encode()}), path)
    return path


def test_pandas_parquet_with_categoricals_and_an_index(tmp_path: Path) -> None:
    source = load_breast_cancer()
    labels = pa.DictionaryArray.from_arrays(pa.array(source.target, pa.int8()), pa.array(["malignant", "benign"]))
    size = pa.DictionaryArray.from_arrays(pa.array(np.arange(569) % 3, pa.int8()), pa.array([0.5, 1.5, 2.5]))
    columns = {"radius": pa.array(source.data[:, 0]), "size": size, "label": labels}
    columns["__index_level_0__"] = pa.array(np.arange(569) + 1000)
    path = pandas_parquet(tmp_path / "t.parquet", columns, ["__index_level_0__"])

    data = parse(path)

    assert data.class_names == ["benign", "malignant"] and data.input_shape == [2]
    np.testing.assert_array_equal(data.x_train[:, 0], source.data[:, 0].astype(np.float32))
    np.testing.assert_array_equal(data.x_train[:, 1], (np.arange(569) % 3 + 0.5).astype(np.float32))
    np.testing.assert_array_equal(np.array(data.class_names)[data.y_train], source.target_names[source.target])


def test_pandas_parquet_named_index_and_categorical_split(tmp_path: Path) -> None:
    split = pa.DictionaryArray.from_arrays(pa.array([0, 0, 0, 1], pa.int8()), pa.array(["train", "test"]))
    columns = {"id": pa.array([7, 8, 9, 10]), "a": pa.array([1.0, 2.0, 3.0, 4.0]), "label": [0, 1, 0, 1]}
    columns["split"] = split
    range_index = {"kind": "range", "name": None, "start": 0, "stop": 4, "step": 1}
    path = pandas_parquet(tmp_path / "t.parquet", columns, ["id", range_index])

    data = parse(path)

    assert data.input_shape == [1] and data.x_test is not None
    np.testing.assert_array_equal(data.x_train[:, 0], [1.0, 2.0, 3.0])


def test_uint64_class_labels_keep_their_value(tmp_path: Path) -> None:
    labels = pa.array([0, 2**64 - 1, 0, 2**64 - 1], pa.uint64())
    path = write_table(tmp_path / "t.parquet", {"a": [1.0, 2.0, 3.0, 4.0], "label": labels})
    data = parse(path)
    assert data.class_names == ["0", "18446744073709551615"]
    np.testing.assert_array_equal(data.y_train, [0, 1, 0, 1])


# --- messages ------------------------------------------------------------------------------------


@pytest.mark.parametrize("filename", ["t.csv", None])
def test_csv_header_not_utf8(tmp_path: Path, filename: str | None) -> None:
    path = tmp_path / "t"
    path.write_bytes("taille,âge,label\n1,30,0\n2,40,1\n".encode("latin-1"))
    message = rejected(path, filename=filename)
    assert "header row is not UTF-8" in message and "byte 0xe2" in message and "column 2" in message


@pytest.mark.parametrize("filename", ["t.csv", None])
def test_csv_label_not_utf8(tmp_path: Path, filename: str | None) -> None:
    path = tmp_path / "t"
    path.write_bytes("a,label\n1,chat\n2,caf\xe9\n3,chat\n".encode("latin-1"))
    message = rejected(path, filename=filename)
    assert "row 2, column 'label' is not UTF-8" in message and "save the file as UTF-8" in message


def test_image_header_over_pillows_limit_names_the_servers(tmp_path: Path) -> None:
    image = png(np.zeros((4, 4), np.uint8))
    path = write_zip(tmp_path / "up.zip", {"train/a/1.png": image, "train/b/2.png": png_header_only(100000, 100000)})
    message = rejected(path, 413)
    assert "train/b/2.png" in message and "10,000,000,000 pixels" in message
    assert f"{UploadLimits().max_image_pixels:,}" in message and "TRAINHUB_MAX_IMAGE_PIXELS" in message


def test_image_within_the_servers_limit_is_not_refused_by_pillows(tmp_path: Path) -> None:
    # 400M pixels is over Pillow's own 179M-pixel refusal; the server allows 1G here, so what
    # stops this header-only PNG is the unpacked-bytes budget its decoded pixels would take.
    image = png(np.zeros((4, 4), np.uint8))
    path = write_zip(tmp_path / "up.zip", {"train/a/1.png": image, "train/b/2.png": png_header_only(20000, 20000)})
    message = rejected(path, 413, UploadLimits(max_image_pixels=10**9, max_unpacked_bytes=10**9))
    assert "train/b/2.png" in message and "TRAINHUB_MAX_DATASET_UNPACKED_BYTES" in message


def test_too_many_images_names_the_setting(tmp_path: Path) -> None:
    path = digits_zip(tmp_path / "digits.zip")
    message = rejected(path, 413, UploadLimits(max_examples=100))
    assert "1,797 images" in message and "TRAINHUB_MAX_DATASET_EXAMPLES" in message


def test_format_given_for_a_file_of_another(tmp_path: Path) -> None:
    csv = write_table(tmp_path / "t.csv", {"a": [1, 2], "label": [0, 1]})
    message = rejected(csv, format="npz", filename="t.csv")
    assert "format=npz" in message and "not an npz (a zip" in message
    assert "pass format=csv or leave format out" in message

    npz = tmp_path / "a.npz"
    np.savez(npz, x_train=np.zeros((2, 2)), y_train=np.zeros(2))
    message = rejected(npz, format="parquet")
    assert "not a Parquet file" in message and "format=npz" in message


@pytest.mark.parametrize("member", ["../../x", "/etc/passwd", "train/../../a.png", "..\\evil.png", "C:/x.png"])
def test_zip_member_outside_the_archive(tmp_path: Path, member: str) -> None:
    image = png(np.zeros((4, 4), np.uint8))
    path = write_zip(tmp_path / "up.zip", {"train/a/1.png": image, "train/b/2.png": image, member: b"x"})
    message = rejected(path)
    assert f"member {member!r} has a path outside the archive" in message


def test_tar_member_outside_the_archive(tmp_path: Path) -> None:
    path = tmp_path / "up.tar"
    with tarfile.open(path, "w") as archive:
        for name in ("../train-images-idx3-ubyte", "train-labels-idx1-ubyte"):
            member = tarfile.TarInfo(name)
            archive.addfile(member, io.BytesIO(b""))
    message = rejected(path)
    assert "member '../train-images-idx3-ubyte' has a path outside the archive" in message
