"""A spec is refused at submit or it trains to finite numbers in both frameworks; never a
framework error, a NaN or an infinity at run time (issue 15, items 1, 2 and 7)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flax.serialization import msgpack_restore
from pydantic import ValidationError
from safetensors.numpy import load_file

from trainers import JobSpec, NanLoss, fit
from trainers.data import load_dataset

FRAMEWORKS = ("jax", "pytorch")
TINY = {"dataset": {"name": "digits", "train_limit": 64, "test_limit": 32}, "epochs": 1}

# The edges of what a spec can ask for: batch norm with batch sizes 1 and 2, on dense layers and
# on conv layers whose feature maps shrink to 2x2, dropout, no hidden layer, one test example...
EDGES = [
    {"model": {"name": "mlp", "hidden_sizes": [8], "batch_norm": True}, "batch_size": 1},
    {"model": {"name": "mlp", "hidden_sizes": [8], "batch_norm": True}, "batch_size": 2},
    {"model": {"name": "mlp", "hidden_sizes": [], "batch_norm": True}, "batch_size": 1},
    {"model": {"name": "cnn", "channels": [2, 2, 2], "hidden_sizes": [4], "batch_norm": True}, "batch_size": 1},
    {"model": {"name": "cnn", "channels": [2, 2, 2], "hidden_sizes": [], "batch_norm": True}, "batch_size": 1},
    {"model": {"name": "cnn", "channels": [2], "hidden_sizes": [4], "dropout": 0.5}, "batch_size": 1},
    {"privacy": {"clip_norm": 1.0, "noise_multiplier": 1.0}, "batch_size": 1},
    {"dataset": {"name": "digits", "train_limit": 64, "test_limit": 1}, "batch_size": 64},
    {"optimizer": {"name": "sgd", "learning_rate": 0.1, "schedule": "warmup_cosine", "warmup_epochs": 1},
     "epochs": 2, "batch_size": 64},
]


@pytest.mark.parametrize("edge", EDGES, ids=lambda edge: json.dumps(edge, separators=(",", ":"))[:60])
def test_a_spec_is_refused_or_trains_to_finite_numbers_in_both_frameworks(tmp_path, edge):
    try:
        specs = [JobSpec(framework=fw, **{**TINY, **edge}) for fw in FRAMEWORKS]
    except ValidationError:
        return  # refused at submit: the other tests check the message
    for spec in specs:
        result = fit(spec, tmp_path / spec.framework, lambda epoch, metrics: None)
        for metrics in result.metrics:
            assert all(np.isfinite([metrics.train_loss, metrics.test_loss, metrics.train_accuracy]))
        weights = load_file(tmp_path / spec.framework / "weights.safetensors")
        assert all(np.isfinite(value).all() for value in weights.values()), spec.framework


@pytest.mark.parametrize("model", [{"name": "mlp", "hidden_sizes": [32], "batch_norm": True},
                                   {"name": "cnn", "channels": [2, 2, 2], "hidden_sizes": [4], "batch_norm": True}])
def test_batch_norm_with_one_example_a_step_is_refused_naming_both_fields(model):
    with pytest.raises(ValidationError) as refused:
        JobSpec(framework="pytorch", **TINY, model=model, batch_size=1)
    message = str(refused.value)
    assert "model.batch_norm" in message and "batch_size" in message
    JobSpec(framework="pytorch", **TINY, model=model, batch_size=2)  # two values per channel suffice


def test_batch_norm_counts_the_batch_each_device_sees():
    spec = {**TINY, "model": {"hidden_sizes": [8], "batch_norm": True}, "hardware": "gpu", "devices": 4}
    with pytest.raises(ValidationError, match="on each of the 4 devices"):
        JobSpec(framework="jax", **spec, batch_size=4)
    JobSpec(framework="jax", **spec, batch_size=8)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_an_overflowing_test_loss_fails_as_nan_loss_and_writes_no_files(tmp_path, framework):
    # Finite training loss (~1e36), infinite test loss: the case.
    spec = JobSpec(framework=framework, dataset={"name": "digits"}, epochs=1, batch_size=128,
                   model={"hidden_sizes": [512] * 6}, optimizer={"name": "adam", "learning_rate": 2000})
    with pytest.raises(NanLoss) as failed:
        fit(spec, tmp_path, lambda epoch, metrics: pytest.fail("a non-finite epoch was reported"))
    assert failed.value.metric in ("train_loss", "test_loss") and failed.value.epoch == 1
    assert "in epoch 1" in str(failed.value)
    assert not (tmp_path / "metrics.json").exists()


def test_a_batch_norm_jax_file_restores_the_reported_accuracy(tmp_path):
    """params.msgpack holds every collection (params and batch_stats), laid out as model.init
    gives them, and `trainhub export --to jax` writes the same: both reproduce the accuracy."""
    from trainers import jax_models
    from trainers.export import export

    spec = JobSpec(framework="jax", dataset={"name": "digits"}, epochs=3, batch_size=32,
                   model={"name": "mlp", "hidden_sizes": [32], "batch_norm": True})
    result = fit(spec, tmp_path, lambda epoch, metrics: None)
    digits = load_dataset(spec.dataset)
    model = jax_models.build(spec.model, digits.num_classes)
    exported = export(tmp_path / "weights.safetensors", "jax", tmp_path / "exported") .read_bytes()
    for raw in ((tmp_path / "params.msgpack").read_bytes(), exported):
        variables = msgpack_restore(raw)
        assert set(variables) == {"params", "batch_stats"}
        template = model.init(jax_models.jax.random.PRNGKey(0), digits.x_test[:1], train=False)
        assert jax_models.jax.tree.structure(template) == jax_models.jax.tree.structure(variables)
        _, accuracy = jax_models.evaluate(model, variables, digits.x_test, digits.y_test)
        assert accuracy == pytest.approx(result.result["test_accuracy"], abs=1e-6)
