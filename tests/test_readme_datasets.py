"""The README's "Your own data" snippets, run as written beside a job's real artifacts: the
preprocessing and the plain PyTorch and plain JAX models give the job's reported test accuracy."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.datasets.formats import UploadOptions, parse_upload
from trainers import JobSpec, RunOptions, fit
from trainers.dataset_file import write

README = Path(__file__).resolve().parent.parent / "README.md"


def section() -> str:
    text = README.read_text()
    start = text.index("### Your own data")
    return text[start : text.index("\n### ", start + 1)]


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", section(), re.S)


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> tuple[Path, float]:
    """A folder with the README's CSV (made by its own command) and the artifacts of a job trained
    on it, and the job's reported test accuracy."""
    folder = tmp_path_factory.mktemp("readme-data")
    make_csv = blocks("sh")[0].split("\n.venv")[0]  # the python -c command that writes the CSV
    subprocess.run(["sh", "-c", make_csv.replace("python -c", f"{sys.executable} -c", 1)], cwd=folder, check=True)
    data = parse_upload(folder / "breast_cancer.csv", UploadOptions(filename="breast_cancer.csv"))
    stored = folder / "data.safetensors"
    write(stored, data)
    info = {"sha256": hashlib.sha256(stored.read_bytes()).hexdigest(), "task": data.task, "input_shape": [30],
            "num_classes": 2, "train_size": len(data.x_train), "test_size": len(data.x_test)}
    spec = JobSpec(framework="pytorch", epochs=5, batch_size=32,
                   dataset={"id": "ds_" + "0" * 32, "standardize": True, "info": info})
    result = fit(spec, folder, lambda epoch, metrics: None, options=RunOptions(dataset_file=stored))
    return folder, result.result["test_accuracy"]


def test_the_section_has_preprocessing_and_both_frameworks():
    python = blocks("python")
    assert len(python) == 3 and "preprocessing.json" in python[0]
    assert "torch" in python[1] and "jax" in python[2]


@pytest.mark.parametrize("framework", ["torch", "jax"])
def test_the_snippets_reproduce_the_reported_accuracy(job, framework, monkeypatch):
    folder, reported = job
    preprocessing, *models = blocks("python")
    model = next(code for code in models if f"import {framework}" in code)
    monkeypatch.chdir(folder)
    scope: dict = {}
    exec(compile(preprocessing + model, "README.md", "exec"), scope)
    accuracy = float(np.mean(scope["predicted"] == scope["labels"]))
    assert len(scope["labels"]) == 114
    # The same float32 model; one borderline example may round the other way outside the trainer.
    assert accuracy == pytest.approx(reported, abs=1.5 / 114)
