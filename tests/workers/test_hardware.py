"""Pinning and hardware checks of `trainhub worker`, each in a fresh process: the variables are
set before jax or torch is first imported, and a worker that cannot use its hardware serves
nothing and exits 2 saying what is missing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workers.hardware import pin

# Run in the child: record the environment and CPU affinity at the moment jax and torch are
# first imported, stub out Celery's worker loop, and run the real `python -m workers` main().
SPY = r"""
import importlib.abc, json, os, sys

VARS = ["CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_PREALLOCATE", "JAX_PLATFORMS", "JAX_DEFAULT_MATMUL_PRECISION", "TPU_VISIBLE_CHIPS",
        "TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "XLA_FLAGS"]
seen = {}

class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("jax", "torch") and name not in seen:
            seen[name] = {"env": {v: os.environ.get(v) for v in VARS}, "affinity": sorted(os.sched_getaffinity(0))}
        return None

sys.meta_path.insert(0, Spy())
from workers.celery_app import celery
assert not {"jax", "torch"} & set(sys.modules), "importing the Celery app imported a framework"
worker_argv, rows = [], {}

def heartbeat_rows():
    from sqlalchemy import select
    from app.db import session_scope
    from app.models import Worker
    with session_scope() as session:
        return [{"name": w.name, "hostname": w.hostname, "hardware": w.hardware, "queues": w.queues,
                 "devices": w.devices, "versions": sorted(w.versions), "current_job_id": w.current_job_id}
                for w in session.scalars(select(Worker).where(Worker.name.contains(f":{os.getpid()}:")))]

def worker_loop(argv):  # the worker loop itself is not under test here: what it would run with is,
    worker_argv.extend(argv)  # and that the first heartbeat waits for it to be ready (consuming)
    rows["before_ready"] = heartbeat_rows()
    from celery.signals import worker_ready
    import time
    worker_ready.send(sender=None)
    deadline = time.monotonic() + 30  # the heartbeat's thread beats once told
    while not (found := heartbeat_rows()) and time.monotonic() < deadline:
        time.sleep(0.05)
    rows["while_serving"] = found

celery.worker_main = worker_loop
from workers.__main__ import main

rc = main(sys.argv[1:])
if worker_argv:
    rows["after_stopping"] = heartbeat_rows()
print("RESULT " + json.dumps({"rc": rc, "seen": seen, "worker_argv": worker_argv, "heartbeat_rows": rows,
                              "prefetch": celery.conf.worker_prefetch_multiplier,
                              "acks_late": celery.conf.task_acks_late}))
"""

# Set by the test runner's machine or an earlier test, they would hide what the worker sets.
PINNING_VARS = ("CUDA_VISIBLE_DEVICES", "XLA_PYTHON_CLIENT_PREALLOCATE", "JAX_PLATFORMS", "JAX_DEFAULT_MATMUL_PRECISION",
                "TPU_VISIBLE_CHIPS",
                "TPU_PROCESS_BOUNDS", "TPU_CHIPS_PER_PROCESS_BOUNDS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
                "XLA_FLAGS", "TRAINHUB_CPU_DEVICES")
HAS_GPU = shutil.which("nvidia-smi") is not None


def run_worker(args: list[str], env: dict[str, str] | None = None) -> tuple[dict, subprocess.CompletedProcess]:
    child_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in PINNING_VARS}
    done = subprocess.run([sys.executable, "-c", SPY, *args], env=child_env, capture_output=True, text=True,
                          timeout=120)
    result = next((json.loads(line[len("RESULT "):]) for line in done.stdout.splitlines()
                   if line.startswith("RESULT ")), None)
    assert result is not None, done.stderr[-3000:]
    return result, done


def test_cpu_worker_is_pinned_before_import_and_registers_what_it_serves(services_env):
    result, done = run_worker(["--hardware", "cpu", "--devices", "0"], services_env)
    assert result["rc"] == 0, done.stderr[-3000:]
    for framework in ("jax", "torch"):
        at_import = result["seen"][framework]
        assert at_import["affinity"] == [0], framework
        assert at_import["env"]["OMP_NUM_THREADS"] == at_import["env"]["MKL_NUM_THREADS"] == "1"
        assert at_import["env"]["CUDA_VISIBLE_DEVICES"] == ""  # a cpu worker never grabs a GPU
        assert at_import["env"]["JAX_PLATFORMS"] == "cpu"
    # one job at a time, one message prefetched, acknowledged when the job is done
    argv = result["worker_argv"]
    assert "--pool=solo" in argv and "--concurrency=1" in argv
    assert "--queues=cpu.jax,cpu.pytorch" in argv
    assert result["prefetch"] == 1 and result["acks_late"] is True
    # the heartbeat row, written once Celery is ready (a job submitted then is taken at once), says
    # who it is and what it serves; stopping deletes it
    name = next(line.split()[2] for line in done.stdout.splitlines() if line.startswith("trainhub worker "))
    assert result["heartbeat_rows"]["before_ready"] == []
    [row] = result["heartbeat_rows"]["while_serving"]
    assert row["name"] == name and row["hardware"] == "cpu" and row["queues"] == ["cpu.jax", "cpu.pytorch"]
    assert row["devices"] == ["cpu:0"] and row["versions"] == ["jax", "pytorch"]
    assert row["hostname"] == name.split(":")[0] and row["current_job_id"] is None
    assert result["heartbeat_rows"]["after_stopping"] == []


@pytest.mark.skipif(HAS_GPU, reason="this host has a GPU")
def test_gpu_worker_is_pinned_before_import_then_exits_2_naming_what_is_missing():
    result, done = run_worker(["--hardware", "gpu", "--devices", "1"])
    assert result["rc"] == 2
    for framework in ("jax", "torch"):
        env = result["seen"][framework]["env"]
        assert env["CUDA_VISIBLE_DEVICES"] == "1"
        assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"  # no grab of the whole card
        assert env["JAX_PLATFORMS"] == "cuda,cpu"  # a CUDA that fails to start is an error, not the CPU
        assert env["JAX_DEFAULT_MATMUL_PRECISION"] == "highest"  # fp32 as fp32, as PyTorch runs it
    assert result["worker_argv"] == []  # never consumed a queue
    assert "not serving gpu.jax" in done.stderr and "no gpu backend" in done.stderr
    assert "not serving gpu.pytorch" in done.stderr and "torch.cuda.is_available() is False" in done.stderr
    assert "cannot serve any of jax, pytorch on gpu" in done.stderr


def test_tpu_worker_is_pinned_before_import_then_exits_2_naming_what_is_missing():
    result, done = run_worker(["--hardware", "tpu", "--devices", "0,1"])
    assert result["rc"] == 2
    env = result["seen"]["jax"]["env"]
    assert env["TPU_VISIBLE_CHIPS"] == "0,1"
    assert env["TPU_CHIPS_PER_PROCESS_BOUNDS"] == "1,2,1" and env["TPU_PROCESS_BOUNDS"] == "1,1,1"
    assert env["JAX_PLATFORMS"] == "tpu,cpu"
    assert "not serving tpu.jax" in done.stderr and "libtpu" in done.stderr
    assert "not serving tpu.pytorch" in done.stderr and "torch_xla" in done.stderr


@pytest.mark.skipif(HAS_GPU, reason="this host has a GPU")
def test_trainhub_worker_gpu_exits_nonzero_on_a_host_without_one():
    """The command as an operator types it (the CLI execs `python -m workers`)."""
    env = {k: v for k, v in os.environ.items() if k not in PINNING_VARS}
    done = subprocess.run([sys.executable, "-m", "app.cli", "worker", "--hardware", "gpu"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "torch.cuda.is_available() is False" in done.stderr
    assert "jax" in done.stderr and "no gpu backend" in done.stderr
    assert "nothing to do" in done.stderr


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_cpu_worker_counted_as_two_devices_serves_the_two_device_queues(services_env):
    result, done = run_worker(["--hardware", "cpu", "--devices", "0,1", "--cpu-devices", "2"], services_env)
    assert result["rc"] == 0, done.stderr[-3000:]
    assert result["seen"]["jax"]["env"]["XLA_FLAGS"].split() == [
        "--xla_force_host_platform_device_count=2", "--xla_cpu_experimental_ynn_fusion_type="]
    assert "--queues=cpu.jax,cpu.jax.x2,cpu.pytorch,cpu.pytorch.x2" in result["worker_argv"]
    [row] = result["heartbeat_rows"]["while_serving"]
    assert row["devices"] == ["cpu:0", "cpu:1"]
    assert result["heartbeat_rows"]["after_stopping"] == []


def test_a_worker_asked_for_more_cpu_devices_than_cores_exits_2_saying_so():
    cores = len(os.sched_getaffinity(0))
    result, done = run_worker(["--hardware", "cpu", "--cpu-devices", str(cores + 1)])
    assert result["rc"] == 2 and result["worker_argv"] == []
    assert f"--cpu-devices {cores + 1} must be between 1 and the {cores} core(s) this worker owns" in done.stderr


def test_a_worker_that_cannot_store_artifacts_serves_nothing(services_env, s3_env):
    env = {**services_env, **s3_env, "TRAINHUB_S3_BUCKET": "no-such-bucket"}
    result, done = run_worker(["--hardware", "cpu", "--frameworks", "jax"], env)
    assert result["rc"] == 2 and result["worker_argv"] == []
    assert "cannot store artifacts (s3)" in done.stderr and "no-such-bucket" in done.stderr


def test_pin_refuses_to_come_after_a_framework_import():
    import jax  # noqa: F401  (this test process has it already; pinning now would be too late)

    with pytest.raises(RuntimeError, match="before jax"):
        pin("gpu", [0])


def test_a_cpu_workers_xla_flags_keep_the_operators_own():
    from workers.hardware import EIGEN_DOTS, xla_cpu_flags

    assert xla_cpu_flags("", 1) == EIGEN_DOTS
    assert xla_cpu_flags("--xla_force_host_platform_device_count=4 --foo", 2).split() == [
        "--foo", "--xla_force_host_platform_device_count=2", EIGEN_DOTS]
    # An operator's own choice of YNNPACK fusions wins.
    own = "--xla_cpu_experimental_ynn_fusion_type=default"
    assert xla_cpu_flags(own, 1) == own


def test_a_cpu_worker_never_imports_triton():
    """Inductor's CPU backend needs no Triton; importing and hashing it cost ~0.35 s of a first
    compile. Pinned to cpu, torch and Inductor see none (compile jobs still run on such workers: the
    quick bench's service and cold-start rows, tests/bench/test_bench.py)."""
    code = (
        "from workers.hardware import pin\n"
        "pin('cpu', None)\n"
        "from torch._inductor import codecache\n"
        "from torch._inductor.runtime import triton_compat\n"
        "assert not triton_compat.HAS_TRITON and codecache.triton_key() is None\n"
        "import torch.utils.flop_counter\n"  # says nothing of the missing triton
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2],
                          capture_output=True, text=True)
    assert "triton" not in done.stderr, done.stderr
