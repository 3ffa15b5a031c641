"""Data parallel JAX on the CPU: two host devices (--xla_force_host_platform_device_count=2, set
before jax starts, so in a fresh process) against one, with the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from trainers import JobSpec
from trainers.spec import ComparisonSpec

SCRIPT = """
import json, sys, tempfile
from trainers import JobSpec, fit
spec = dict(dataset={"name": "digits", "train_limit": 512}, batch_size=64, epochs=2, seed=3,
            model={"name": sys.argv[1], "channels": [4], "hidden_sizes": [32]} if sys.argv[1] == "cnn"
            else {"hidden_sizes": [32]})
out = {}
for devices in (1, 2):
    result = fit(JobSpec(framework="jax", devices=devices, **spec), tempfile.mkdtemp(), lambda e, m: None)
    out[devices] = {"losses": [m.train_loss for m in result.metrics], "first": result.result["first_step_loss"],
                    "compilations": result.timings["compilations"], "devices": result.device["devices"]}
print(json.dumps(out))
"""

# Measured: equal to ~1e-7 (XLA sums the two halves' gradients in another order than one device).
LOSS_RTOL = 1e-5


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_jax_on_two_devices_matches_one_with_the_same_global_batch(model):
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, model], env=env, capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[2])
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    one, two = runs["1"], runs["2"]
    assert two["devices"] == ["cpu:0", "cpu:1"] and one["devices"] == ["cpu:0"]
    assert two["compilations"] == 1
    assert two["first"] == pytest.approx(one["first"], rel=LOSS_RTOL)
    assert two["losses"] == pytest.approx(one["losses"], rel=LOSS_RTOL)


def test_more_devices_than_the_process_sees_is_a_hardware_mismatch(tmp_path):
    from trainers import HardwareMismatch, fit

    with pytest.raises(HardwareMismatch, match="2 cpu devices"):
        fit(JobSpec(framework="jax", devices=2, dataset={"name": "digits"}, epochs=1), tmp_path, lambda e, m: None)


def test_pytorch_data_parallel_is_refused_until_built():
    with pytest.raises(ValidationError, match="framework jax only"):
        JobSpec(framework="pytorch", devices=2)
    with pytest.raises(ValidationError, match="framework jax only"):
        ComparisonSpec(devices=2)
