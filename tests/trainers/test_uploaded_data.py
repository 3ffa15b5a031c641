"""Trainers on uploaded datasets (trainers/dataset_file.py's form): any feature count, non-square
colour images for the cnn, regression, the validation split and standardisation."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from trainers import JobSpec, RunOptions, fit
from trainers.common import forward, read_weights
from trainers.data import load_dataset
from trainers.dataset_file import DatasetArrays, write
from trainers.spec import DatasetSpec
from trainers.torch_models import load_weights

FRAMEWORKS = ("jax", "pytorch")


def stored(tmp_path: Path, data: DatasetArrays) -> tuple[Path, dict]:
    """The dataset written to a file, and the `info` the API would fill in for it."""
    path = tmp_path / "data.safetensors"
    write(path, data)
    info = {"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "task": data.task,
            "input_shape": data.input_shape, "num_classes": data.num_classes, "train_size": len(data.x_train),
            "test_size": 0 if data.x_test is None else len(data.x_test)}
    return path, info


def spec(framework: str, info: dict, **fields) -> JobSpec:
    dataset = {"id": "ds_" + "0" * 32, "info": info, **fields.pop("dataset", {})}
    return JobSpec(framework=framework, dataset=dataset, **fields)


@pytest.fixture(scope="module")
def colour_images(tmp_path_factory) -> tuple[Path, dict]:
    """Non-square RGB noise images [6, 10, 3], their class the channel made brighter."""
    rng = np.random.default_rng(0)
    y = rng.integers(0, 3, 300).astype(np.int32)
    x = rng.integers(0, 120, (300, 6, 10, 3)).astype(np.uint8)
    x[np.arange(300), :, :, y] += 100
    data = DatasetArrays(x[:240], y[:240], x[240:], y[240:], "classification", ["r", "g", "b"], "npz")
    return stored(tmp_path_factory.mktemp("colour"), data)


def test_a_cnn_trains_on_non_square_colour_images_alike_in_both_frameworks(colour_images, tmp_path):
    path, info = colour_images
    model = {"name": "cnn", "channels": [4], "hidden_sizes": [16]}
    runs = {}
    for framework in FRAMEWORKS:
        job = spec(framework, info, model=model, epochs=3, batch_size=20)
        runs[framework] = fit(job, tmp_path / framework, lambda e, m: None, options=RunOptions(dataset_file=path))
    assert runs["jax"].result["first_step_loss"] == pytest.approx(runs["pytorch"].result["first_step_loss"], abs=1e-5)
    assert runs["pytorch"].result["test_accuracy"] > 0.6
    # The weights file, read with the job's input shape, gives the PyTorch model's logits.
    data = load_dataset(spec("jax", info).dataset, dataset_file=path)
    weights = tmp_path / "pytorch" / "weights.safetensors"
    with torch.no_grad():
        logits = load_weights(weights, input_shape=[6, 10, 3])(torch.from_numpy(data.x_test.copy())).numpy()
    np.testing.assert_allclose(forward(read_weights(weights), data.x_test, [6, 10, 3]), logits, atol=1e-4)


def test_regression_reports_its_scores_in_both_frameworks(tmp_path):
    from sklearn.datasets import load_diabetes

    diabetes = load_diabetes()
    data = DatasetArrays(diabetes.data.astype(np.float32), diabetes.target.astype(np.float32), None, None,
                         "regression", [], "csv")
    path, info = stored(tmp_path, data)
    results = {}
    for framework in FRAMEWORKS:
        job = spec(framework, info, dataset={"validation_split": 0.2, "standardize": True}, epochs=10, batch_size=32,
                   optimizer={"learning_rate": 0.01})
        results[framework] = fit(job, tmp_path / framework, lambda e, m: None, options=RunOptions(dataset_file=path))
    for result in results.values():
        last = result.metrics[-1]
        assert last.train_accuracy is None and last.test_accuracy is None
        assert last.test_rmse == pytest.approx(last.test_loss**0.5) and 0 < last.test_r2 <= 1
        assert {"test_rmse", "test_mae", "test_r2", "test_loss"} <= set(result.result)
    losses = [[m.train_loss for m in results[fw].metrics] for fw in FRAMEWORKS]
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-3)


def test_the_validation_split_is_fixed_disjoint_and_standardised_on_training_examples(tmp_path):
    x = np.arange(100 * 3, dtype=np.float32).reshape(100, 3)
    y = (np.arange(100) % 2).astype(np.int32)
    path, info = stored(tmp_path, DatasetArrays(x, y, None, None, "classification", ["a", "b"], "csv"))
    dataset = DatasetSpec(id="ds_" + "0" * 32, info=info, validation_split=0.2, standardize=False)
    first, again = load_dataset(dataset, dataset_file=path), load_dataset(dataset, dataset_file=path)
    assert (len(first.x_train), len(first.x_test)) == (80, 20)
    np.testing.assert_array_equal(first.x_test, again.x_test)
    rows = {tuple(row) for row in first.x_train}
    assert not rows & {tuple(row) for row in first.x_test} and len(rows) == 80
    scaled = load_dataset(dataset.model_copy(update={"standardize": True}), dataset_file=path)
    np.testing.assert_allclose(scaled.x_train.mean(axis=0), 0, atol=1e-5)
    np.testing.assert_allclose(scaled.x_train.std(axis=0), 1, atol=1e-5)
    np.testing.assert_allclose(scaled.mean, first.x_train.mean(axis=0), rtol=1e-6)
