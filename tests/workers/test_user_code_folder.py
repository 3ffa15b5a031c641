"""A user-code job's folder (workers/user_code.py): what its child writes is capped while it runs
(TRAINHUB_USER_CODE_DISK_BYTES, a count of entries) and removed once it ends, all but the
artifacts, logs.txt and the trainers' checkpoints. tests/e2e/test_user_code.py runs both through
the service."""

from __future__ import annotations

import os

import pytest

from trainers import jax_checkpoint, torch_checkpoint
from workers import user_code
from workers.user_code import UserCodeFailed, _check_folder, _clean_folder


def test_the_kept_names_are_the_trainers_checkpoints_and_the_artifacts():
    assert torch_checkpoint.CHECKPOINT_FILE in user_code.KEPT_NAMES
    assert jax_checkpoint.CHECKPOINT_DIR == user_code.CHECKPOINT_DIR  # kept as a folder, in a JAX job
    assert {*user_code.ARTIFACT_NAMES, user_code.LOG_FILE} <= user_code.KEPT_NAMES


def test_a_folder_past_its_byte_limit_fails_wherever_in_it_the_bytes_are(tmp_path):
    (tmp_path / "tmp" / "deep").mkdir(parents=True)
    (tmp_path / "tmp" / "deep" / "a.bin").write_bytes(b"0" * 600)
    _check_folder(tmp_path, 1000)

    (tmp_path / ".code").mkdir()  # the worker's copy of the code is no hiding place
    (tmp_path / ".code" / "b.bin").write_bytes(b"0" * 600)
    with pytest.raises(UserCodeFailed, match="limit of 1,000 bytes"):
        _check_folder(tmp_path, 1000)


def test_a_folder_of_too_many_files_fails(tmp_path, monkeypatch):
    monkeypatch.setattr(user_code, "MAX_FOLDER_ENTRIES", 5)
    for i in range(6):
        (tmp_path / f"f{i}").touch()
    with pytest.raises(UserCodeFailed, match="more than 5 files"):
        _check_folder(tmp_path, 10**9)


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_cleaning_keeps_the_artifacts_and_checkpoints_only(tmp_path, framework):
    kept = ["weights.safetensors", "state_dict.pt", "metrics.json", "logs.txt", "checkpoint.pt"]
    for name in kept:
        (tmp_path / name).write_text("x")
    (tmp_path / "checkpoints" / "3").mkdir(parents=True)  # Orbax's, in a JAX job
    (tmp_path / "preprocessing.json").mkdir()  # an artifact's name, but a folder
    for folder in ("tmp", ".code", ".data", ".cache"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "file").write_text("x")
    (tmp_path / "mine.bin").write_text("x")
    outside = tmp_path.parent / f"{tmp_path.name}-outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("x")
    os.symlink(outside, tmp_path / "link")  # removed as a link; what it points to stays
    os.symlink(outside / "keep.txt", tmp_path / "metrics.json.link")

    _clean_folder(tmp_path, framework)

    expected = [*kept, "checkpoints"] if framework == "jax" else kept
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(expected)
    assert (outside / "keep.txt").exists()
