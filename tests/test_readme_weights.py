"""The README's "Using your weights" snippets, run as written in folders of real artifacts: each
gives the job's reported test accuracy (issue 16, item 12)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from trainers import JobSpec, fit
from trainers.data import load_dataset

README = Path(__file__).resolve().parent.parent / "README.md"
DIGITS = {"dataset": {"name": "digits"}, "epochs": 2, "batch_size": 32}
MODELS = {
    "mlp": {"hidden_sizes": [32]},
    "mlp-batch-norm": {"hidden_sizes": [32], "batch_norm": True},
    "cnn-batch-norm": {"name": "cnn", "channels": [4, 8], "hidden_sizes": [16], "batch_norm": True},
}


def snippets() -> dict[str, str]:
    """The section's python blocks that give `predicted`, keyed by the start of the paragraph that
    introduces each ("PyTorch", "Plain PyTorch", "JAX/flax" twice)."""
    text = README.read_text()
    section = text[text.index("### Using your weights") :]
    section = section[: section.index("\n### ", 1)]
    blocks = {}
    for match in re.finditer(r"```python\n(.*?)```", section, re.S):
        intro = section[: match.start()].rstrip().split("\n\n")[-1].replace("\n", " ")
        if "predicted =" in match.group(1):
            blocks[intro] = match.group(1)
    return blocks


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[tuple[str, str], tuple[Path, float]]:
    """(framework, model) -> (folder of its artifacts, reported test accuracy)."""
    out = {}
    for framework in ("jax", "pytorch"):
        for name, model in MODELS.items():
            workdir = tmp_path_factory.mktemp(f"{framework}-{name}")
            result = fit(JobSpec(framework=framework, model=model, **DIGITS), workdir, lambda epoch, metrics: None)
            out[framework, name] = workdir, result.result["test_accuracy"]
    return out


def run_snippet(code: str, workdir: Path, monkeypatch) -> np.ndarray:
    digits = load_dataset(JobSpec(framework="jax", **DIGITS).dataset)
    monkeypatch.chdir(workdir)
    scope = {"x": digits.x_test.copy()}  # as a user's own array: writable
    exec(compile(code, "README.md", "exec"), scope)
    return (np.asarray(scope["predicted"]) == digits.y_test).mean()


def test_the_section_has_its_snippets():
    starts = sorted(intro.split(",")[0] for intro in snippets())
    assert starts == ["JAX/flax", "JAX/flax", "Plain PyTorch", "PyTorch"]


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
@pytest.mark.parametrize("model", list(MODELS))
def test_each_snippet_reproduces_the_reported_accuracy(runs, framework, model, monkeypatch):
    workdir, reported = runs[framework, model]
    texts = README.read_text()
    for intro, code in snippets().items():
        if "params.msgpack" in code and framework != "jax":
            continue  # a PyTorch job has no params.msgpack
        if intro.startswith("Plain PyTorch") and model != "mlp":
            continue  # the plain module is the mlp without batch norm, as the README says
        accuracy = run_snippet(code, workdir, monkeypatch)
        assert accuracy == pytest.approx(reported, abs=1e-6), (intro, framework, model)
    assert "### Using your weights" in texts
