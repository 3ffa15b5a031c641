"""Users' own data through the whole service, on real data nobody here made: uploaded, trained in
both frameworks, compared with a parity check, and the downloaded weights reproducing the metric."""

from __future__ import annotations

import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sklearn.datasets import load_breast_cancer, load_diabetes, load_digits

from trainers.common import forward, read_weights

FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def table(path: Path, x: np.ndarray, y: np.ndarray, label: str = "label", split: np.ndarray | None = None) -> Path:
    import pyarrow as pa
    import pyarrow.csv
    import pyarrow.parquet

    columns = {f"f{i}": x[:, i] for i in range(x.shape[1])} | {label: y}
    if split is not None:
        columns["split"] = split
    data = pa.table(columns)
    if path.suffix == ".csv":
        pyarrow.csv.write_csv(data, path)
    else:
        pyarrow.parquet.write_table(data, path)
    return path


def parity_passed(comparison: dict) -> None:
    assert comparison["status"] == "succeeded", ({fw: job["error"] for fw, job in comparison["jobs"].items()}, comparison["parity"])
    assert comparison["parity"]["passed"], comparison["parity"]


def test_breast_cancer_csv_in_both_frameworks_and_parquet_weights_reproduce(service, tmp_path):
    data = load_breast_cancer()
    csv = table(tmp_path / "breast_cancer.csv", data.data, data.target)
    with service.client() as client:
        uploaded = client.upload_dataset(csv)
        assert (uploaded["task"], uploaded["input_shape"], uploaded["num_classes"]) == ("classification", [30], 2)
        comparison = client.compare({"dataset": {"id": uploaded["id"], "validation_split": 0.2}, "epochs": 5,
                                     "batch_size": 32})
        comparison = client.wait_comparison(comparison["id"], timeout_s=300)
        parity_passed(comparison)
        for job in comparison["jobs"].values():
            assert job["result"]["test_accuracy"] > 0.9, job["result"]
            assert job["timings"]["data_s"] >= 0 and job["timings"]["data_cache_hit"] in (0.0, 1.0)
        # One worker fetched it once: the second job found it in the cache.
        assert sorted(job["timings"]["data_cache_hit"] for job in comparison["jobs"].values()) == [0.0, 1.0]

        # The same table as Parquet with its own test split; the downloaded weights and
        # preprocessing.json give the reported accuracy in plain numpy.
        split = np.where(np.arange(len(data.target)) % 5 == 0, "test", "train")
        parquet = table(tmp_path / "breast_cancer.parquet", data.data, data.target, split=split)
        uploaded = client.upload_dataset(parquet)
        assert (uploaded["format"], uploaded["train_size"], uploaded["test_size"]) == ("parquet", 455, 114)
        job = client.submit({"framework": "jax", "dataset": {"id": uploaded["id"]}, "epochs": 5, "batch_size": 32})
        job = client.wait(job["id"], timeout_s=300)
        assert job["status"] == "succeeded", job["error"]
        files = {path.name: path for path in client.download_all(job["id"], tmp_path / "job")}
    preprocessing = json.loads(files["preprocessing.json"].read_text())
    assert preprocessing["standardize"] and preprocessing["input_shape"] == [30]
    x_test = data.data[split == "test"].astype(np.float32) * preprocessing["scale"]
    std = np.asarray(preprocessing["std"], np.float32)
    x_test = (x_test - np.asarray(preprocessing["mean"], np.float32)) / np.where(std > 0, std, 1)
    predictions = forward(read_weights(files["weights.safetensors"]), x_test).argmax(axis=1)
    accuracy = float(np.mean(predictions == data.target[split == "test"]))
    assert accuracy == pytest.approx(job["result"]["test_accuracy"], abs=1e-6)


def test_diabetes_regression_in_both_frameworks(service, tmp_path):
    data = load_diabetes()
    csv = table(tmp_path / "diabetes.csv", data.data, data.target.astype(np.float64), label="target")
    with service.client() as client:
        uploaded = client.upload_dataset(csv, label_column="target", task="regression")
        assert (uploaded["task"], uploaded["num_classes"], uploaded["input_shape"]) == ("regression", 0, [10])
        spec = {"dataset": {"id": uploaded["id"], "validation_split": 0.2}, "epochs": 30, "batch_size": 32,
                "optimizer": {"name": "adam", "learning_rate": 0.01}}
        comparison = client.wait_comparison(client.compare(spec)["id"], timeout_s=300)
        parity_passed(comparison)
        rows = {row["metric"]: row for row in comparison["table"]}
        assert "test_accuracy" not in rows and {"test_rmse", "test_mae", "test_r2"} <= set(rows)
        for job in comparison["jobs"].values():
            metrics = client.get(job["id"])["metrics"]
            last = metrics[-1]
            assert last["train_accuracy"] is None and last["test_accuracy"] is None
            assert last["test_rmse"] == pytest.approx(last["test_loss"] ** 0.5)
            assert 0.2 < last["test_r2"] <= 1 and last["test_mae"] < last["test_rmse"]
            assert metrics[-1]["test_loss"] < metrics[0]["test_loss"]


@pytest.mark.skipif(not FASHION_MNIST.exists(), reason="needs Debian's dataset-fashion-mnist (make data)")
def test_fashion_mnist_idx_upload_trains_as_the_built_in_one(service, tmp_path):
    archive = tmp_path / "fashion.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(FASHION_MNIST.glob("*ubyte*")):
            tar.add(path, arcname=f"fashion/{path.name}")
    limits = {"train_limit": 2000, "test_limit": 500}
    with service.client() as client:
        uploaded = client.upload_dataset(archive)
        assert (uploaded["format"], uploaded["input_shape"], uploaded["train_size"]) == ("idx", [28, 28, 1], 60000)
        spec = {"epochs": 2, "batch_size": 64, "seed": 3}
        mine = {**spec, "dataset": {"id": uploaded["id"], "standardize": False, **limits}}
        comparison = client.wait_comparison(client.compare(mine)["id"], timeout_s=400)
        parity_passed(comparison)
        built_in = client.submit({**spec, "framework": "jax", "dataset": {"name": "fashion-mnist", **limits}})
        built_in = client.wait(built_in["id"], timeout_s=300)
    assert built_in["status"] == "succeeded", built_in["error"]
    assert comparison["jobs"]["jax"]["result"]["test_accuracy"] == built_in["result"]["test_accuracy"]


def digits_imagefolder(path: Path) -> Path:
    digits = load_digits()
    with zipfile.ZipFile(path, "w") as archive:
        for i, (image, label) in enumerate(zip(digits.images, digits.target)):
            split = "test" if i % 5 == 0 else "train"
            png = io.BytesIO()
            Image.fromarray((image * 255 / 16).astype(np.uint8), mode="L").save(png, format="PNG")
            archive.writestr(f"{split}/{label}/{i}.png", png.getvalue())
    return path


def test_digits_imagefolder_cnn_in_both_frameworks(service, tmp_path):
    with service.client() as client:
        uploaded = client.upload_dataset(digits_imagefolder(tmp_path / "digits.zip"))
        assert (uploaded["format"], uploaded["input_shape"]) == ("imagefolder", [8, 8, 1])
        assert uploaded["class_names"] == [str(i) for i in range(10)]
        spec = {"dataset": {"id": uploaded["id"]}, "model": {"name": "cnn", "channels": [8], "hidden_sizes": [32]},
                "epochs": 3, "batch_size": 32}
        comparison = client.wait_comparison(client.compare(spec)["id"], timeout_s=400)
    parity_passed(comparison)
    assert comparison["jobs"]["pytorch"]["result"]["test_accuracy"] > 0.8
