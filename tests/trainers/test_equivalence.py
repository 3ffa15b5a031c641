"""A JAX job and a PyTorch job with the same spec start from the same weights and batches."""

import numpy as np
import pytest
import torch

from trainers import jax_models, torch_models
from trainers.common import init_params
from trainers.data import load_dataset
from trainers.spec import DatasetSpec, ModelSpec


def test_both_models_hold_the_initial_weights_unchanged():
    weights = init_params(64, [32, 16], 10, seed=3)

    from_jax = jax_models.weights_from_params(jax_models.params_from_weights(weights))
    from_torch = torch_models.from_weights(weights).state_dict()

    for name, value in weights.items():
        np.testing.assert_array_equal(from_jax[name], value)
        np.testing.assert_array_equal(from_torch[name].numpy(), value)


def test_both_models_compute_the_same_logits():
    digits = load_dataset(DatasetSpec(name="digits"))
    weights = init_params(64, [256, 128], 10, seed=0)
    jax_model = jax_models.build(ModelSpec(hidden_sizes=[256, 128]), 10)

    jax_logits = jax_model.apply({"params": jax_models.params_from_weights(weights)}, digits.x_test)
    with torch.no_grad():
        torch_logits = torch_models.from_weights(weights)(torch.tensor(digits.x_test))

    np.testing.assert_allclose(np.asarray(jax_logits), torch_logits.numpy(), atol=1e-5)


def test_first_step_loss_is_the_same_in_both_frameworks(tmp_path, digits_spec, train):
    # One batch of 64 is the whole training set: epoch 1's train loss is the first step's loss.
    spec = {"dataset": {"name": "digits", "train_limit": 64}, "batch_size": 64, "epochs": 1}
    jax_run = train(digits_spec("jax", **spec), tmp_path / "jax")
    torch_run = train(digits_spec("pytorch", **spec), tmp_path / "pytorch")

    jax_epoch, torch_epoch = jax_run.result.metrics[0], torch_run.result.metrics[0]
    assert jax_epoch.train_loss == pytest.approx(torch_epoch.train_loss, abs=1e-5)
    assert jax_epoch.train_accuracy == torch_epoch.train_accuracy
    # After the same Adam step, the test loss still agrees closely.
    assert jax_epoch.test_loss == pytest.approx(torch_epoch.test_loss, abs=1e-4)


def test_both_frameworks_follow_the_same_path(digits_runs):
    jax_losses = [m.train_loss for m in digits_runs["jax"].result.metrics]
    torch_losses = [m.train_loss for m in digits_runs["pytorch"].result.metrics]
    np.testing.assert_allclose(jax_losses, torch_losses, rtol=1e-2)
