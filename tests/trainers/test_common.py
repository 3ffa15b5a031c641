import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

from trainers.base import EpochMetrics
from trainers.common import (
    architecture,
    epoch_batches,
    fit_timings,
    init_params,
    steady_epoch_s,
    write_common_artifacts,
)
from trainers.spec import JobSpec


def test_init_params_names_shapes_and_scale():
    weights = init_params(784, [256, 128], 10, seed=0)

    assert {name: w.shape for name, w in weights.items()} == {
        "layers.0.weight": (256, 784), "layers.0.bias": (256,),
        "layers.1.weight": (128, 256), "layers.1.bias": (128,),
        "layers.2.weight": (10, 128), "layers.2.bias": (10,),
    }
    assert all(w.dtype == np.float32 for w in weights.values())
    assert not weights["layers.1.bias"].any()
    assert weights["layers.0.weight"].std() == pytest.approx(np.sqrt(2 / 784), rel=0.02)
    assert architecture(weights) == (784, [256, 128], 10)


def test_init_params_depends_on_the_seed_only():
    a, b, c = init_params(64, [32], 10, 7), init_params(64, [32], 10, 7), init_params(64, [32], 10, 8)
    np.testing.assert_array_equal(a["layers.0.weight"], b["layers.0.weight"])
    assert not np.array_equal(a["layers.0.weight"], c["layers.0.weight"])


def test_epoch_batches_drop_the_partial_batch():
    batches = epoch_batches(seed=0, epoch=1, n=1000, batch_size=128)

    assert batches.shape == (7, 128) and batches.dtype == np.int32
    assert len(np.unique(batches)) == 7 * 128 and 0 <= batches.min() and batches.max() < 1000
    np.testing.assert_array_equal(batches, epoch_batches(0, 1, 1000, 128))
    assert not np.array_equal(batches, epoch_batches(0, 2, 1000, 128))
    with pytest.raises(ValueError):
        epoch_batches(0, 1, 100, 128)


def metrics(epoch: int, epoch_time_s: float) -> EpochMetrics:
    return EpochMetrics(epoch, 0.5, 0.8, 0.4, 0.85, epoch_time_s, 0.01, 1000.0)


def test_timings_leave_the_first_epoch_out_of_the_steady_time():
    epochs = [metrics(1, 3.0), metrics(2, 1.0), metrics(3, 2.0), metrics(4, 1.2)]
    timings = fit_timings(0.5, 0.7, 1, epochs)

    assert timings["steady_epoch_s"] == 1.2 and timings["first_epoch_s"] == 3.0
    assert timings["train_s"] == pytest.approx(7.2) and timings["compilations"] == 1
    assert steady_epoch_s([2.5]) == 2.5


def test_common_artifacts(tmp_path):
    spec = JobSpec(framework="jax", dataset={"name": "digits"})
    weights = init_params(64, [16], 10, 0)

    names = write_common_artifacts(tmp_path, weights, [metrics(1, 1.0)], spec)

    assert names == ["weights.safetensors", "metrics.json", "spec.json"]
    loaded = load_file(tmp_path / "weights.safetensors")
    np.testing.assert_array_equal(loaded["layers.0.weight"], weights["layers.0.weight"])
    assert json.loads((tmp_path / "metrics.json").read_text())[0]["test_accuracy"] == 0.85
    assert JobSpec.model_validate_json((tmp_path / "spec.json").read_text()) == spec


def test_the_same_weights_make_the_same_file(tmp_path):
    # Users compare artifacts by their sha256: identical weights and spec, identical bytes.
    spec = JobSpec(framework="jax", dataset={"name": "digits"})
    weights = init_params(64, [16], 10, 0)
    files = set()
    for i in range(8):
        (tmp_path / str(i)).mkdir()
        write_common_artifacts(tmp_path / str(i), weights, [metrics(1, 1.0)], spec)
        files.add((tmp_path / str(i) / "weights.safetensors").read_bytes())

    assert len(files) == 1
    loaded = load_file(tmp_path / "0" / "weights.safetensors")
    np.testing.assert_array_equal(loaded["layers.0.weight"], weights["layers.0.weight"])
    # The rewritten header still reads, its metadata whole, and sorted in the file.
    with safe_open(tmp_path / "0" / "weights.safetensors", "np") as f:
        metadata = f.metadata()
    assert {"format", "framework", "trainhub_model"} <= set(metadata) and json.loads(metadata["trainhub_model"])
    raw = files.pop()
    in_file = json.loads(raw[8 : 8 + int.from_bytes(raw[:8], "little")])["__metadata__"]
    assert list(in_file) == sorted(metadata) and in_file == metadata


def test_a_header_serialised_otherwise_is_sorted_too_and_its_tensors_kept(tmp_path):
    # A header our serialisation would make shorter (here: spaces after every separator): the file
    # is written again around the new header rather than left in hash-map order.
    from safetensors.numpy import save_file

    from trainers import common

    path = tmp_path / "w.safetensors"
    tensors = {"b": np.arange(5, dtype=np.float32), "a": np.ones((3, 2), dtype=np.float32)}
    save_file(tensors, path, metadata={"z": "1", "m": "é", "a": "3"})
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    loose = json.dumps(json.loads(raw[8 : 8 + size]), separators=(", ", ": "), ensure_ascii=False).encode()
    loose += b" " * (-len(loose) % 8)
    path.write_bytes(len(loose).to_bytes(8, "little") + loose + raw[8 + size :])

    common._sort_metadata(path)

    rewritten = path.read_bytes()
    size = int.from_bytes(rewritten[:8], "little")
    assert size % 8 == 0 and size < len(loose)
    assert list(json.loads(rewritten[8 : 8 + size])["__metadata__"]) == ["a", "m", "z"]
    loaded = load_file(path)
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)
    with safe_open(path, "np") as f:
        assert f.metadata() == {"z": "1", "m": "é", "a": "3"}


def test_the_package_imports_no_framework():
    code = (
        "import sys, trainers, trainers.data, trainers.common\n"
        "heavy = {'jax', 'torch', 'flax', 'optax', 'torchvision',\n"
        "         'celery', 'sqlalchemy', 'fastapi', 'app', 'workers'}\n"
        "assert not heavy & set(sys.modules), heavy & set(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_remove_checkpoint_removes_each_name_on_its_own_and_never_a_links_target(tmp_path, monkeypatch):
    import shutil

    from trainers.base import remove_checkpoint

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "kept").write_bytes(b"x")
    job = tmp_path / "job"
    (job / "checkpoint.pt").mkdir(parents=True)  # not a file, all the same
    (job / "checkpoint.pt" / "f").write_bytes(b"x")
    (job / "checkpoint.partial").write_bytes(b"x")
    (job / "checkpoints").symlink_to(outside)
    (job / "weights.safetensors").write_bytes(b"x")

    remove_checkpoint(job)
    assert sorted(p.name for p in job.iterdir()) == ["weights.safetensors"]
    assert (outside / "kept").is_file()
    remove_checkpoint(job)  # nothing there: fine

    (job / "checkpoint.pt").mkdir()  # the first name tried: its removal fails
    (job / "checkpoint.partial").write_bytes(b"x")

    def refuse(path, *args, **kwargs):
        raise PermissionError(f"cannot remove {path}")

    monkeypatch.setattr(shutil, "rmtree", refuse)
    with pytest.raises(PermissionError):
        remove_checkpoint(job)
    assert not (job / "checkpoint.partial").exists()  # the others went all the same
