"""Data parallel on the CPU, two devices against one with the same global batch: JAX on two host
devices (--xla_force_host_platform_device_count=2, set before jax starts, so in a fresh process),
PyTorch with DDP over two gloo processes."""

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
MODELS = {"cnn": {"name": "cnn", "channels": [4], "hidden_sizes": [32]}, "mlp": {"hidden_sizes": [32]},
          "layers": {"layers": [{"type": "conv2d", "filters": 4}, {"type": "layer_norm"}, {"type": "gelu"},
                                {"type": "residual", "layers": [{"type": "conv2d", "filters": 6}, {"type": "relu"}]},
                                {"type": "global_avg_pool"}, {"type": "dense", "units": 10}]}}
spec = dict(dataset={"name": "digits", "train_limit": 512}, batch_size=64, epochs=2, seed=3, model=MODELS[sys.argv[1]])
out = {}
for devices in (1, 2):
    result = fit(JobSpec(framework="jax", devices=devices, **spec), tempfile.mkdtemp(), lambda e, m: None)
    out[devices] = {"losses": [m.train_loss for m in result.metrics], "first": result.result["first_step_loss"],
                    "compilations": result.timings["compilations"], "devices": result.device["devices"]}
print(json.dumps(out))
"""

# Measured: equal to ~1e-7 (XLA sums the two halves' gradients in another order than one device).
LOSS_RTOL = 1e-5


@pytest.mark.parametrize("model", ["mlp", "cnn", "layers"])
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


# PyTorch DDP, two gloo processes on the two cores, against one process with the same global batch.
# Measured: the losses agree to ~1e-7 (gloo sums the two halves' gradients in another order).
TORCH_SPEC = dict(dataset={"name": "digits", "train_limit": 512}, batch_size=64, epochs=2, seed=3)
TORCH_MODELS = {
    "mlp": {"model": {"hidden_sizes": [32]}},
    "cnn": {"model": {"name": "cnn", "channels": [4], "hidden_sizes": [16]}},
    # DP-SGD: each device clips its examples' gradients, the sums are all-reduced (noise off, so
    # the two runs can be compared; the noise is drawn once per step on rank 0).
    "mlp-privacy": {"model": {"hidden_sizes": [32]}, "privacy": {"clip_norm": 0.5, "noise_multiplier": 0.0}},
    # A layer list with a residual and a layer norm, with DP-SGD's per-example gradients.
    "layers-privacy": {"model": {"layers": [{"type": "dense", "units": 24}, {"type": "layer_norm"}, {"type": "tanh"},
                                            {"type": "residual", "layers": [{"type": "dense", "units": 24},
                                                                             {"type": "silu"}]},
                                            {"type": "dense", "units": 10}]},
                       "privacy": {"clip_norm": 0.5, "noise_multiplier": 0.0}},
}
needs_two_cores = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="DDP on cpu needs two cores")


def _torch_fit(tmp_path: Path, name: str, devices: int, report=lambda e, m: None, **extra):
    from trainers import fit

    spec = JobSpec(framework="pytorch", devices=devices, **TORCH_SPEC, **TORCH_MODELS[name], **extra)
    return fit(spec, tmp_path / f"{name}-{devices}", report)


@needs_two_cores
@pytest.mark.parametrize("name", list(TORCH_MODELS))
def test_pytorch_ddp_on_two_processes_matches_one_device_with_the_same_global_batch(tmp_path, name):
    from trainers.common import read_weights

    one = _torch_fit(tmp_path, name, 1)
    reported = []
    two = _torch_fit(tmp_path, name, 2, lambda e, m: reported.append((e, m.train_loss)))
    assert one.device["devices"] == ["cpu:0"] and two.device["devices"] == ["cpu:0", "cpu:1"]
    assert reported == [(m.epoch, m.train_loss) for m in two.metrics]  # rank 0's epochs reach the caller
    assert two.result["first_step_loss"] == pytest.approx(one.result["first_step_loss"], rel=LOSS_RTOL)
    assert [m.train_loss for m in two.metrics] == pytest.approx([m.train_loss for m in one.metrics], rel=LOSS_RTOL)
    assert [m.train_accuracy for m in two.metrics] == [m.train_accuracy for m in one.metrics]
    assert two.metrics[-1].test_accuracy == pytest.approx(one.metrics[-1].test_accuracy, abs=1e-3)
    # One model comes out: rank 0's weights, the same as one device's.
    w1 = read_weights(tmp_path / f"{name}-1" / "weights.safetensors")
    w2 = read_weights(tmp_path / f"{name}-2" / "weights.safetensors")
    assert set(w1) == set(w2)
    for key in w1:
        assert w2[key] == pytest.approx(w1[key], abs=1e-4), key
    assert two.timings["train_s"] == pytest.approx(sum(m.epoch_time_s for m in two.metrics))
    assert set(two.artifacts) == set(one.artifacts)


@needs_two_cores
def test_pytorch_ddp_stops_on_cancel_and_resumes_from_its_checkpoint(tmp_path):
    from trainers import StopTraining

    def stop_after_first_epoch(epoch, metrics):
        if epoch == 1:
            raise StopTraining("cancelled", "cancelled by the user")

    with pytest.raises(StopTraining):
        _torch_fit(tmp_path, "mlp", 2, stop_after_first_epoch)
    assert not [p for p in _children() if "spawn_main" in p], "a rank was left running"
    # The next attempt (a restarted worker) goes on from epoch 2 with the same result.
    reported = []
    resumed = _torch_fit(tmp_path, "mlp", 2, lambda e, m: reported.append(e))
    assert reported == [1, 2]
    straight = _torch_fit(tmp_path / "straight", "mlp", 2)
    assert [m.train_loss for m in resumed.metrics] == pytest.approx([m.train_loss for m in straight.metrics], rel=1e-6)


@needs_two_cores
def test_a_failing_rank_fails_the_run_with_its_error(tmp_path):
    from trainers import NanLoss, fit

    spec = JobSpec(framework="pytorch", devices=2, dataset={"name": "digits"}, epochs=3, batch_size=64,
                   optimizer={"learning_rate": 1e4}, model={"hidden_sizes": [256] * 8})
    with pytest.raises(NanLoss, match=r"in epoch \d; lower optimizer.learning_rate"):
        fit(spec, tmp_path, lambda e, m: None)
    assert not [p for p in _children() if "spawn_main" in p], "a rank was left running"


def _children() -> list[str]:
    """Command lines of this process's live children."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
            if entry.name.isdigit() and int(stat.rsplit(")", 1)[1].split()[1]) == me and stat.rsplit(")", 1)[1].split()[0] != "Z":
                found.append((entry / "cmdline").read_text().replace("\0", " "))
        except (OSError, ValueError, IndexError):
            continue
    return found


def test_more_devices_than_cores_is_a_hardware_mismatch(tmp_path):
    from trainers import HardwareMismatch, fit

    cores = len(os.sched_getaffinity(0))
    with pytest.raises(HardwareMismatch, match=f"{cores + 1} cpu devices"):
        fit(JobSpec(framework="pytorch", devices=cores + 1, dataset={"name": "digits"}, batch_size=64 * (cores + 1),
                    epochs=1), tmp_path, lambda e, m: None)


@pytest.mark.parametrize("extra, message", [
    ({"model": {"batch_norm": True}}, "SyncBatchNorm"),
    ({"compile": True}, "compile with devices above 1"),
    ({"hardware": "tpu"}, "pytorch on tpu"),
])
def test_pytorch_data_parallel_it_cannot_do_like_jax_is_refused_with_the_fix(extra, message):
    with pytest.raises(ValidationError, match=message):
        JobSpec(framework="pytorch", devices=2, **extra)
    if "compile" not in extra:  # a comparison trains PyTorch too
        with pytest.raises(ValidationError, match=message):
            ComparisonSpec(devices=2, **extra)
    JobSpec(framework="jax", devices=2, **extra)  # JAX's batch norm under jit is the global batch's
