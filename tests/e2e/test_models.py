"""Models described once through the whole service: lenet5, resnet8 and a list of the user's own
train in JAX and PyTorch from the same weights, and each comparison's parity check passes."""

from __future__ import annotations

from pathlib import Path

import pytest

FASHION = {"dataset": {"name": "fashion-mnist", "train_limit": 1024, "test_limit": 256}, "batch_size": 64}


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").exists(), reason="needs dataset-fashion-mnist")
@pytest.mark.parametrize("preset", ["lenet5", "resnet8"])
def test_a_preset_trains_alike_in_both_frameworks(service, preset):
    with service.client() as client:
        comparison = client.compare({**FASHION, "model": {"name": preset}, "epochs": 2})
        comparison = client.wait_comparison(comparison["id"], timeout_s=400)
    assert comparison["status"] == "succeeded", {fw: job["error"] for fw, job in comparison["jobs"].items()}
    assert comparison["parity"]["passed"], comparison["parity"]
    for job in comparison["jobs"].values():
        assert job["result"]["test_accuracy"] > 0.5
        assert job["model"]["parameters"] == {"lenet5": 61706, "resnet8": 77658}[preset]


def test_a_users_own_list_trains_alike_and_reports_its_size(service):
    layers = [
        {"type": "conv2d", "filters": 8, "kernel_size": 5, "padding": "valid", "strides": 2},
        {"type": "layer_norm"},
        {"type": "gelu"},
        {"type": "residual", "layers": [{"type": "conv2d", "filters": 12, "kernel_size": 3}, {"type": "tanh"}]},
        {"type": "global_avg_pool"},
        {"type": "dense", "units": 32},
        {"type": "silu"},
        {"type": "dense", "units": 10},
    ]
    with service.client() as client:
        comparison = client.compare({**FASHION, "model": {"layers": layers}, "epochs": 2})
        comparison = client.wait_comparison(comparison["id"], timeout_s=400)
    assert comparison["status"] == "succeeded", {fw: job["error"] for fw, job in comparison["jobs"].items()}
    assert comparison["parity"]["passed"], comparison["parity"]
    job = comparison["jobs"]["jax"]
    # conv 8x1x5x5+8, layer norm 2x8, residual conv 12x8x3x3+12 and its 1x1 projection 12x8+12, dense 32x12+32, 10x32+10
    assert job["model"]["parameters"] == 208 + 16 + 876 + 108 + 416 + 330
