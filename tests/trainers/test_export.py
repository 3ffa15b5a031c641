"""Weights exported to the other framework's format give the same logits (max |diff| <= 1e-4)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flax.serialization import from_bytes

from trainers import JobSpec, fit
from trainers.data import load_dataset
from trainers.export import export
from trainers.jax_models import load_weights as jax_load
from trainers.torch_models import from_weights, load_weights as torch_load

SPEC = {"dataset": {"name": "digits"}, "epochs": 2, "batch_size": 64}


@pytest.fixture(scope="module")
def x_test() -> np.ndarray:
    return load_dataset(JobSpec(framework="jax", **SPEC).dataset).x_test


@pytest.mark.parametrize("framework", ["jax", "pytorch"])
def test_export_round_trip_keeps_the_logits(framework, tmp_path, x_test):
    fit(JobSpec(framework=framework, **SPEC), tmp_path, lambda e, m: None)
    weights = tmp_path / "weights.safetensors"
    jax_model, jax_variables = jax_load(weights)
    jax_params = jax_variables["params"]
    torch_model = torch_load(weights).eval()

    state_dict = torch.load(export(weights, "pytorch", tmp_path / "pt"), weights_only=True)
    exported_torch = from_weights({k: v.numpy() for k, v in state_dict.items()}).eval()
    template = {"params": jax_params}
    exported_params = from_bytes(template, (export(weights, "jax", tmp_path / "jx")).read_bytes())["params"]

    with torch.no_grad():
        torch_logits = torch_model(torch.from_numpy(x_test)).numpy()
        exported_torch_logits = exported_torch(torch.from_numpy(x_test)).numpy()
    jax_logits = np.asarray(jax_model.apply({"params": jax_params}, x_test))
    exported_jax_logits = np.asarray(jax_model.apply({"params": exported_params}, x_test))

    assert np.abs(torch_logits - jax_logits).max() <= 1e-4
    assert np.abs(exported_torch_logits - jax_logits).max() <= 1e-4
    assert np.abs(exported_jax_logits - torch_logits).max() <= 1e-4
    assert (torch_logits.argmax(1) == jax_logits.argmax(1)).mean() == 1.0


def test_export_refuses_an_unknown_framework(tmp_path):
    with pytest.raises(ValueError, match="framework must be one of"):
        export(tmp_path / "weights.safetensors", "tensorflow", tmp_path)
