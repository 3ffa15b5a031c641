"""`make gpu-check` (`python -m bench.gpu_check`): the service end to end on one NVIDIA GPU.

    python -m bench.gpu_check [--hardware gpu|cpu] [--out FILE] [--epochs N] [--quick] [--var-dir DIR]

One prepared run, on the embedded stack (SQLite and kombu's filesystem broker under a fresh var
dir, as `trainhub up` keeps them), so it needs no servers:

1. the machine: the GPU's name, driver and memory (`nvidia-smi`), the versions of jax, its CUDA
   plugin, torch and its CUDA and cuDNN, and the matmul rates a separate process measures on
   device 0 before the worker starts (torch: bf16, fp32 and TF32; JAX: bf16 and fp32 at its
   default precision; 8192^3, CUDA events / block_until_ready, after warm-ups);
2. the stack: an API key (`trainhub keys create --init --var-dir`), the API (`trainhub serve`)
   and one worker `trainhub worker --hardware gpu --devices 0`, which must come online serving
   both gpu.jax and gpu.pytorch;
3. through the HTTP API (app.client.TrainhubClient): the seeds' MLP (784-256-128-10, Adam 1e-3,
   batch 128) on Fashion-MNIST in JAX and in PyTorch, each in fp32 and `"precision": "bf16"`;
   a comparison (POST /comparisons) of the same fp32 spec, with its parity check; and a large
   MLP (hidden 4096 x 3, batch 4096, 240 batches of synthetic 784-feature data an epoch, 3
   epochs) in both frameworks and both precisions, whose achieved TFLOP/s is
   3 x model_plan(spec).flops (forward FLOPs per example, trainers.spec; about 6 x the
   multiply-adds) x examples per epoch / steady_epoch_s, reported against the card's dense bf16,
   TF32 and fp32 peaks (PEAKS, from NVIDIA's datasheets) and against the measured matmul rates.

It prints the tables and writes everything (date, machine, versions, each job's timings,
accuracy and worker, the comparison's parity, the FLOP/s figures, what was skipped and why) to
--out (default bench/gpu_check.json; bench/gpu_check-cpu.json with --hardware cpu, so a CPU run
never overwrites the GPU figures). Every job must succeed and the comparison's parity pass: else
it says why, with the end of the worker's log, and exits 1.

`--hardware cpu` runs the same checks on the CPU (CI runs it with --quick, tests/bench/): a cpu
worker, bf16 skipped (the spec refuses bf16 on cpu; the output says so), the large MLP at a
size a CPU gets through, its GFLOP/s against the fp32 matmul rate bench.loops.matmul_rate
measures (the best of torch and JAX, as `make bench` does). `--quick` shrinks every part
(Fashion-MNIST limited to 2048/1000 examples, 2 epochs; in cpu mode the large MLP 1024 wide).
Measured on an H200 (2026-12-04): 143 s with --quick (README has its figures), ~40 s of it the
stack's start and the matmul probe; the full run is expected to take 3-5 minutes (the large
MLP's fp32 epochs, ~4.3 s each at 240 batches, and its synthetic data); under a minute with
--hardware cpu --quick on 2 shared cores (47 s measured here).

On the device machine (the library's `device` tool, kind nvidia-h200), `make gpu-check` cannot
run (its `install` builds a venv from a registry that machine cannot reach): run the module with
the image's python3 (3.12), which has jax 0.11 with jax-cuda13-plugin, torch 2.11+cu130, flax,
optax, numpy, httpx, rich, typer, safetensors, msgpack, scikit-learn, pyarrow, pillow, jinja2
and prometheus-client. Missing there, and carried as cp312 manylinux wheels (about 19 MB, the
versions of this venv: `.venv/bin/pip freeze`): fastapi starlette opentelemetry-api pydantic
pydantic-core annotated-types typing-inspection pydantic-settings python-dotenv uvicorn
sqlalchemy greenlet alembic mako celery kombu billiard vine amqp click-didyoumean click-plugins
click-repl prompt-toolkit wcwidth tzlocal redis python-multipart swagger-ui-py optuna colorlog.
(With those alone over such a package set, a Python 3.11 copy here created a key, served the
API and brought a worker online.) Fashion-MNIST is not there either. Once, here, in the repo:

    echo /.whl/ >> .git/info/exclude; echo /.gpucheck/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
        -d .whl fastapi==VERSION ...   # each package above at this venv's version
    mkdir -p .gpucheck/fashion-mnist && cp /usr/share/datasets/fashion-mnist/*.gz .gpucheck/fashion-mnist/

then one `run` with carry [".whl", ".gpucheck"] (about 50 MB with the tree) and timeout_s 600:

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
    export TRAINHUB_DATA_DIR=$PWD/.gpucheck PYTHONUNBUFFERED=1; set -o pipefail
    nvidia-smi; python3 -m bench.gpu_check --out $OUT/gpu_check.json 2>&1 | tee $OUT/gpu_check.log
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.markup import escape

from app.status import JobStatus

if TYPE_CHECKING:
    from rich.console import Console

    from app.client import TrainhubClient
    from app.stack import Stack

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = {"gpu": REPO_ROOT / "bench" / "gpu_check.json", "cpu": REPO_ROOT / "bench" / "gpu_check-cpu.json"}
PROBE_PREFIX = "GPU_CHECK_PROBE "
LABEL = "gpu-check"

# The seeds' model and optimizer: 784-256-128-10, ReLU, Adam 1e-3, batch 128.
SEED_MLP = {
    "model": {"name": "mlp", "hidden_sizes": [256, 128], "dropout": 0.0},
    "optimizer": {"name": "adam", "learning_rate": 1e-3},
    "batch_size": 128,
    "seed": 0,
}
PRECISIONS = ("fp32", "bf16")
FRAMEWORKS = ("jax", "pytorch")


@dataclass(frozen=True)
class Peak:
    """A card's dense peaks in TFLOP/s: bf16 and TF32 on the tensor cores, fp32 on the CUDA cores."""

    bf16: float
    tf32: float
    fp32: float
    source: str


_DATASHEET = "dense figures (without the 2:4 sparsity the datasheets' larger bf16 and TF32 figures assume)"
# Keyed by a regular expression on the name `nvidia-smi --query-gpu=name` prints (e.g. "NVIDIA
# H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"); the first match wins, so the more
# specific names come first.
PEAKS: list[tuple[str, Peak]] = [
    (r"H200 NVL", Peak(835, 418, 60, f"NVIDIA H200 NVL datasheet, {_DATASHEET}")),
    (
        r"H200",
        Peak(
            989,
            494,
            67,
            f"NVIDIA H200 SXM datasheet (the H100 SXM's rates), {_DATASHEET}; an 8192^3 bf16 matmul "
            "reached 769-798 TFLOP/s on the device tool's nvidia-h200 machines",
        ),
    ),
    (r"H100 NVL", Peak(835, 418, 60, f"NVIDIA H100 NVL datasheet, {_DATASHEET}")),
    (r"H100 PCIe", Peak(756, 378, 51, f"NVIDIA H100 PCIe datasheet, {_DATASHEET}")),
    (r"H100", Peak(989, 494, 67, f"NVIDIA H100 SXM datasheet, {_DATASHEET}")),
    (r"A100", Peak(312, 156, 19.5, f"NVIDIA A100 datasheet, {_DATASHEET}")),
    (r"L40S", Peak(362, 183, 91.6, f"NVIDIA L40S datasheet, {_DATASHEET}")),
    (r"\bL4\b", Peak(121, 60, 30.3, f"NVIDIA L4 datasheet, {_DATASHEET}")),
]


def peak_for(gpu_name: str) -> Peak | None:
    """The PEAKS entry of the card `nvidia-smi` names `gpu_name`; None for a card not in the table."""
    for pattern, peak in PEAKS:
        if re.search(pattern, gpu_name, re.IGNORECASE):
            return peak
    return None


@dataclass
class Config:
    """What one run does; `for_mode` gives the sizes of each mode."""

    hardware: str
    quick: bool
    epochs: int  # of the Fashion-MNIST jobs and the comparison
    train_limit: int | None
    test_limit: int | None
    large_hidden: list[int]
    large_batch: int
    large_steps: int  # batches an epoch: examples per epoch = large_steps x large_batch
    large_test: int
    large_epochs: int
    matmul_sizes: list[int]
    matmul_repeats: int
    deadline_s: float  # for every job and the comparison, from the first submission

    @staticmethod
    def for_mode(hardware: str, quick: bool, epochs: int | None) -> Config:
        gpu = hardware == "gpu"
        config = Config(
            hardware=hardware,
            quick=quick,
            epochs=5 if gpu else 2,
            train_limit=None if gpu else 10000,
            test_limit=None if gpu else 2000,
            large_hidden=[4096, 4096, 4096],
            large_batch=4096,
            large_steps=240 if gpu else 2,
            large_test=4096,
            large_epochs=3 if gpu else 2,
            matmul_sizes=[8192] if gpu else [2048, 3072],
            matmul_repeats=10 if gpu else 3,
            deadline_s=420.0 if gpu else 1200.0,
        )
        if quick:
            config.epochs, config.train_limit, config.test_limit = 2, 2048, 1000
            config.large_epochs, config.matmul_repeats = 2, 3
            if gpu:
                config.large_steps = 60
            else:  # a 4096-wide step is ~1 TFLOP: seconds on a CPU
                config.large_hidden, config.large_batch, config.large_steps = [1024, 1024, 1024], 1024, 4
                config.large_test, config.matmul_sizes = 1024, [1024, 2048]
                config.deadline_s = 240.0
        if epochs is not None:
            config.epochs = epochs
        return config


@dataclass
class Planned:
    """One job (or the comparison) to run: its name, kind, the body sent, and what became of it."""

    name: str
    kind: str  # fashion-mnist, large-mlp or comparison
    framework: str | None
    precision: str
    body: dict
    skipped: str | None = None  # why the spec refuses it on this hardware
    id: str | None = None
    final: dict | None = None
    error: str | None = None  # a submission refused, a timeout
    elapsed_s: float | None = None  # submit to finished, as this script saw it
    extra: dict = field(default_factory=dict)


# --- the probe: versions and matmul rates, in a process of its own -----------------------------


def probe(hardware: str, sizes: list[int], repeats: int) -> dict:
    """Versions and matmul rates, pinned as a worker is (workers.hardware.pin) before jax or
    torch is imported. Run in its own process (`--probe`) before the worker starts, so neither
    holds the GPU while the other measures."""
    from workers.hardware import pin

    pin(hardware, [0] if hardware == "gpu" else None)
    versions = package_versions()
    if hardware == "cpu":
        from bench.loops import matmul_rate

        cpu_rates = matmul_rate(tuple(sizes), repeats)
        import torch

        versions["torch_cuda"] = torch.version.cuda  # the build's CUDA, unused on a cpu worker
        return {
            "versions": versions,
            "matmul": {
                "fp32_gflops": cpu_rates["gflops"],
                "by_framework": cpu_rates["by_framework"],
                "what": f"best of {repeats} n x n fp32 matmuls, n in {sizes}, torch and JAX (bench.loops.matmul_rate)",
            },
        }
    # A framework that cannot use the GPU is recorded here and left to the worker to refuse, so
    # the run still says which queue it cannot serve and why.
    rates: dict[str, float] = {}
    defaults: dict[str, object] = {}
    errors: dict[str, str] = {}
    n = sizes[0]
    try:
        import torch

        versions["torch_cuda"] = torch.version.cuda
        versions["cudnn"] = str(torch.backends.cudnn.version())
        versions["torch_sees"] = torch.cuda.get_device_name(0)
        defaults["torch_allow_tf32"] = torch.backends.cuda.matmul.allow_tf32
        defaults["torch_float32_matmul_precision"] = torch.get_float32_matmul_precision()
        rates["torch_bf16"] = _torch_matmul_tflops(torch, torch.bfloat16, n, repeats, tf32=False)
        rates["torch_fp32"] = _torch_matmul_tflops(torch, torch.float32, n, repeats, tf32=False)
        rates["torch_tf32"] = _torch_matmul_tflops(torch, torch.float32, n, repeats, tf32=True)
        torch.backends.cuda.matmul.allow_tf32 = defaults["torch_allow_tf32"]
        torch.cuda.empty_cache()
    except Exception as exc:  # recorded; the worker's own check decides
        errors["torch"] = f"{type(exc).__name__}: {exc}"
    try:
        import jax

        defaults["jax_default_matmul_precision"] = getattr(jax.config, "jax_default_matmul_precision", None)
        versions["jax_backend"] = jax.default_backend()
        if jax.default_backend() != "gpu":  # "cuda,cpu" falls back to the CPU without the CUDA plugin
            raise RuntimeError(f"jax {jax.__version__} runs on {jax.default_backend()}, not the GPU")
        rates |= _jax_matmul_tflops(n, repeats)
    except Exception as exc:
        errors["jax"] = f"{type(exc).__name__}: {exc}"
    return {
        "versions": versions,
        "matmul": {
            "tflops": rates,
            "defaults": defaults,
            "errors": errors,
            "what": f"{n}x{n} @ {n}x{n} (2 n^3 FLOPs), mean of {repeats} after 3 warm-ups; torch_fp32 with "
            "allow_tf32 off, torch_tf32 with it on; jax_fp32 at JAX's default precision (TF32 on NVIDIA "
            "GPUs since Ampere: a rate far above the fp32 peak says so)",
        },
    }


def _torch_matmul_tflops(torch: Any, dtype: Any, n: int, repeats: int, tf32: bool) -> float:
    torch.backends.cuda.matmul.allow_tf32 = tf32
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", dtype=dtype, generator=generator)
    b = torch.randn(n, n, device="cuda", dtype=dtype, generator=generator)
    for _ in range(3):
        torch.mm(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        torch.mm(a, b)
    end.record()
    end.synchronize()
    seconds = start.elapsed_time(end) / 1e3 / repeats
    del a, b
    return 2 * n**3 / seconds / 1e12


def _jax_matmul_tflops(n: int, repeats: int) -> dict[str, float]:
    import jax
    import jax.numpy as jnp

    matmul = jax.jit(jnp.matmul)
    rates = {}
    for name, dtype in (("jax_bf16", jnp.bfloat16), ("jax_fp32", jnp.float32)):
        a, b = (jax.random.normal(jax.random.PRNGKey(i), (n, n), dtype) for i in (0, 1))
        for _ in range(3):
            matmul(a, b).block_until_ready()
        start = time.perf_counter()
        for _ in range(repeats):
            out = matmul(a, b)
        out.block_until_ready()  # the calls queue up on the device; the last one ends them all
        rates[name] = 2 * n**3 / ((time.perf_counter() - start) / repeats) / 1e12
        del a, b, out
    return rates


def package_versions() -> dict[str, str | None]:
    """Installed versions of the frameworks and their CUDA parts (None: not installed)."""
    import importlib.metadata as metadata

    names = ["jax", "jaxlib", "flax", "optax", "torch", "torchvision", "numpy"]
    names += sorted(
        {
            d.metadata["Name"]
            for d in metadata.distributions()
            if re.match(r"jax[-_]cuda\d+[-_]", d.metadata["Name"] or "")
        }
    )
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def run_probe(config: Config, env: dict[str, str]) -> dict:
    command = [sys.executable, "-m", "bench.gpu_check", "--probe", "--hardware", config.hardware]
    command += [
        "--matmul-sizes",
        ",".join(map(str, config.matmul_sizes)),
        "--matmul-repeats",
        str(config.matmul_repeats),
    ]
    done = subprocess.run(command, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    for line in done.stdout.splitlines():
        if line.startswith(PROBE_PREFIX):
            return json.loads(line[len(PROBE_PREFIX) :])
    raise RuntimeError(f"the probe exited with code {done.returncode}: {done.stderr[-2000:]}")


# --- the machine ---------------------------------------------------------------------------


def gpu_info() -> dict:
    """Device 0 as nvidia-smi sees it. Raises RuntimeError when there is no NVIDIA GPU."""
    query = "name,driver_version,memory.total,clocks.max.sm,power.limit"
    try:
        out = subprocess.run(
            ["nvidia-smi", "-i", "0", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"nvidia-smi did not run ({exc}): no NVIDIA driver here; use --hardware cpu") from None
    if out.returncode != 0 or not out.stdout.strip():
        raise RuntimeError(f"nvidia-smi found no GPU 0 ({(out.stderr or out.stdout).strip()}); use --hardware cpu")
    name, driver, memory, max_sm, power = (v.strip() for v in out.stdout.strip().splitlines()[0].split(","))
    header = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
    cuda = re.search(r"CUDA Version:\s*([\d.]+)", header)
    return {
        "name": name,
        "driver": driver,
        "cuda_driver_api": cuda.group(1) if cuda else None,
        "memory_mib": _number_or_none(memory),
        "max_sm_clock_mhz": _number_or_none(max_sm),
        "power_limit_w": _number_or_none(power),
    }


def gpu_sample() -> dict | None:
    """Device 0's SM clock, power draw and utilization now (None when nvidia-smi fails)."""
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "-i",
                "0",
                "--query-gpu=clocks.sm,power.draw,utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
            ],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        clock, power, util, memory = (v.strip() for v in out.strip().split(","))
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None
    return {
        "sm_clock_mhz": _number_or_none(clock),
        "power_w": _number_or_none(power),
        "utilization_pct": _number_or_none(util),
        "memory_used_mib": _number_or_none(memory),
    }


def _number_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


# --- the stack -----------------------------------------------------------------------------


def child_env(var_dir: Path) -> dict[str, str]:
    """The stack's environment (app.stack.embedded_env: everything under var_dir), with this
    repository importable from any working directory (the device machine has no installed trainhub)."""
    from app.stack import embedded_env

    env = embedded_env(var_dir)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def create_key(env: dict[str, str], var_dir: Path) -> str:
    """`trainhub keys create --init --var-dir`: migrates the embedded database; the secret is the last line."""
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", "create", "--init", "--var-dir", str(var_dir), "--name", LABEL],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
    )
    if done.returncode != 0 or not done.stdout.strip():
        raise RuntimeError(f"trainhub keys create exited with code {done.returncode}: {done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


def start_stack(config: Config, env: dict[str, str], var_dir: Path) -> Stack:
    """The API (`trainhub serve`) and one worker (`trainhub worker --hardware H [--devices 0]`),
    logging to <var_dir>/logs/, each dying with this process (app.stack.Child)."""
    from app.stack import Child, Stack, free_port

    logs = var_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = free_port()
    worker = [sys.executable, "-m", "app.cli", "worker", "--hardware", config.hardware]
    if config.hardware == "gpu":
        worker += ["--devices", "0"]
    commands = {
        "api": [sys.executable, "-m", "app.cli", "serve", "--host", "127.0.0.1", "--port", str(port)],
        "worker": worker,
    }
    running = Stack(url=f"http://127.0.0.1:{port}")
    for name, command in commands.items():
        child = Child(name, command, env, logs / f"{name}.log")
        running.children.append(child)
        running.processes.append(child.start())
    return running


def wait_for_worker(client: TrainhubClient, running: Stack, hardware: str, timeout_s: float = 240.0) -> dict:
    """The online worker serving <hardware>.jax and <hardware>.pytorch (GET /workers). Raises
    RuntimeError when the worker exits, serves only one of them, or is not online in time."""
    wanted = {f"{hardware}.{framework}" for framework in FRAMEWORKS}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for process, child in zip(running.processes, running.children):
            if process.poll() is not None:
                raise RuntimeError(f"{child.name} exited with code {process.returncode}: {log_tail(child.log_path)}")
        online = [w for w in client.workers()["workers"] if w["online"] and w["hardware"] == hardware]
        for worker in online:
            if wanted <= set(worker["queues"]):
                return worker
            missing = ", ".join(sorted(wanted - set(worker["queues"])))
            raise RuntimeError(
                f"the worker serves {', '.join(worker['queues'])} but not {missing}: {refusals(running)}"
            )
        time.sleep(0.5)
    raise RuntimeError(
        f"no {hardware} worker came online in {timeout_s:.0f} s: {log_tail(running.children[-1].log_path)}"
    )


def log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def refusals(running: Stack) -> str:
    """The worker's 'not serving gpu.jax: why' lines (workers/__main__.py), else its log's end."""
    worker_log = running.children[-1].log_path
    lines = [line for line in log_tail(worker_log, 200).splitlines() if "not serving" in line]
    return "\n".join(lines) or log_tail(worker_log)


# --- the jobs ------------------------------------------------------------------------------


def plan_jobs(config: Config) -> list[Planned]:
    """Fashion-MNIST jobs (each framework x precision), the comparison, then the large MLPs."""
    from trainers.spec import ComparisonSpec, JobSpec

    hw = config.hardware
    fashion = {"name": "fashion-mnist", "train_limit": config.train_limit, "test_limit": config.test_limit}
    large = {
        "model": {"name": "mlp", "hidden_sizes": config.large_hidden, "dropout": 0.0},
        "optimizer": {"name": "adam", "learning_rate": 1e-3},
        "dataset": {
            "name": "synthetic",
            "train_limit": config.large_steps * config.large_batch,
            "test_limit": config.large_test,
        },
        "batch_size": config.large_batch,
        "epochs": config.large_epochs,
        "seed": 0,
    }
    planned = []
    for kind, base, epochs in (("fashion-mnist", SEED_MLP, config.epochs), ("large-mlp", large, config.large_epochs)):
        for precision in PRECISIONS:
            for framework in FRAMEWORKS:
                name = f"{LABEL} {kind} {framework} {precision}"
                body = {**base, "framework": framework, "hardware": hw, "epochs": epochs, "name": name}
                body |= {"precision": precision, "labels": {"check": LABEL}}
                if kind == "fashion-mnist":
                    body["dataset"] = fashion
                planned.append(Planned(name, kind, framework, precision, body, skipped=_refusal(JobSpec, body)))
        if kind == "fashion-mnist":
            name = f"{LABEL} comparison fp32"
            body = {**SEED_MLP, "hardware": hw, "epochs": config.epochs, "dataset": fashion, "name": name}
            body["labels"] = {"check": LABEL}
            planned.append(Planned(name, "comparison", None, "fp32", body, skipped=_refusal(ComparisonSpec, body)))
    return planned


def _refusal(schema: Any, body: dict) -> str | None:
    """Why `schema` (JobSpec, ComparisonSpec) refuses `body` (None: it takes it), in the API's words."""
    from pydantic import ValidationError

    try:
        schema.model_validate(body)
    except ValidationError as exc:
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return None


def submit_all(client: TrainhubClient, planned: list[Planned]) -> None:
    from app.client import ApiError, format_detail

    for job in planned:
        if job.skipped:
            continue
        job.extra["submitted_at"] = time.monotonic()
        try:
            created = client.compare(job.body) if job.kind == "comparison" else client.submit(job.body)
        except ApiError as exc:
            job.error = f"refused by the API ({exc.status_code}): {format_detail(exc.detail)}"
            continue
        job.id = created["id"]


def wait_all(
    client: TrainhubClient, planned: list[Planned], config: Config, console: Console, running: Stack
) -> list[dict]:
    """Poll every submitted job and the comparison until each ends (or the deadline passes: the
    rest are cancelled); in gpu mode, sample the GPU's clock and power every 2 s meanwhile."""
    from app.client import FINISHED

    samples: list[dict] = []
    pending = [job for job in planned if job.id]
    deadline = time.monotonic() + config.deadline_s
    next_sample = 0.0
    while pending:
        for process, child in zip(running.processes, running.children):
            if process.poll() is not None:
                for job in pending:
                    job.error = f"{child.name} exited with code {process.returncode} while it waited"
                return samples
        for job in list(pending):
            job_id = str(job.id)
            current = client.get_comparison(job_id) if job.kind == "comparison" else client.get(job_id)
            if current["status"] in FINISHED:
                job.final = current
                job.elapsed_s = time.monotonic() - job.extra.pop("submitted_at")
                pending.remove(job)
                colour = "green" if current["status"] == JobStatus.SUCCEEDED else "red"
                console.print(
                    f"  [{colour}]{current['status']:>9}[/{colour}] {escape(job.name)} ({job.elapsed_s:.1f} s)"
                )
        if config.hardware == "gpu" and time.monotonic() >= next_sample:
            if sample := gpu_sample():
                samples.append({"t": round(time.monotonic(), 1), **sample})
            next_sample = time.monotonic() + 2.0
        if time.monotonic() > deadline:
            for job in pending:
                job.error = f"not finished {config.deadline_s:.0f} s after the first submission; cancelled"
                if job.kind != "comparison":
                    try:
                        client.cancel(str(job.id))
                    except Exception:  # best effort: the stack stops next anyway
                        pass
            break
        time.sleep(0.5)
    return samples


# --- results -------------------------------------------------------------------------------


def job_record(job: Planned) -> dict:
    """A job's entry in the JSON: spec summary, status, timings, accuracy, worker."""
    record: dict[str, Any] = {
        "name": job.name,
        "kind": job.kind,
        "framework": job.framework,
        "precision": job.precision,
        "id": job.id,
        "skipped": job.skipped,
        "error": job.error,
        "elapsed_s": job.elapsed_s,
    }
    final = job.final
    if final is None:
        return record
    record["status"] = final["status"]
    if job.kind == "comparison":
        record["spec"] = final.get("spec")
        record["parity"] = final.get("parity")
        record["table"] = final.get("table")
        record["overlap_s"] = final.get("overlap_s")
        record["jobs"] = {fw: _job_summary(j) for fw, j in (final.get("jobs") or {}).items()}
        if final.get("error"):
            record["error"] = f"{final['error']['type']}: {final['error']['message']}"
        return record
    record |= _job_summary(final)
    return record


def _job_summary(final: dict) -> dict:
    metrics = final.get("metrics") or []
    error = final.get("error")
    return {
        "id": final["id"],
        "status": final["status"],
        "error": f"{error['type']}: {error['message']}" if error else None,
        "timings": final.get("timings"),
        "result": final.get("result"),
        "test_accuracy": (final.get("result") or {}).get("test_accuracy"),
        "epoch_times_s": [m.get("epoch_time_s") for m in metrics],
        "samples_per_s": [m.get("samples_per_s") for m in metrics],
        "worker": final.get("worker"),
    }


def large_mlp_rates(planned: list[Planned], config: Config, peak: Peak | None, matmul: dict) -> list[dict]:
    """Achieved FLOP/s of each large MLP job: 3 x forward FLOPs per example (model_plan) x the
    examples of an epoch (whole batches: the partial one is dropped) / steady_epoch_s."""
    from bench.flops import model_flops_per_epoch
    from trainers.spec import JobSpec, train_size

    rows = []
    for job in planned:
        if job.kind != "large-mlp" or job.skipped:
            continue
        spec = JobSpec.model_validate(job.body)
        samples = train_size(spec.dataset) // spec.batch_size * spec.batch_size
        flops = model_flops_per_epoch(spec, samples)
        row = {"name": job.name, "framework": job.framework, "precision": job.precision, **flops}
        timings = (job.final or {}).get("timings") or {}
        steady = timings.get("steady_epoch_s")
        row["steady_epoch_s"] = steady
        if job.final is None or job.final["status"] != JobStatus.SUCCEEDED or not steady:
            rows.append(row)
            continue
        achieved = flops["flops"] / steady
        if config.hardware == "cpu":
            row["achieved_gflops"] = achieved / 1e9
            row["matmul_gflops"] = matmul.get("fp32_gflops")
            row["of_matmul"] = achieved / 1e9 / matmul["fp32_gflops"] if matmul.get("fp32_gflops") else None
        else:
            row["achieved_tflops"] = achieved / 1e12
            if peak is not None:
                if job.precision == "bf16":
                    row["of_peak"] = {"bf16": achieved / 1e12 / peak.bf16}
                else:
                    row["of_peak"] = {"fp32": achieved / 1e12 / peak.fp32, "tf32": achieved / 1e12 / peak.tf32}
            prefix = "torch" if job.framework == "pytorch" else "jax"
            measured = (matmul.get("tflops") or {}).get(f"{prefix}_{job.precision}")
            row["matmul_tflops"] = measured
            row["of_matmul"] = achieved / 1e12 / measured if measured else None
        rows.append(row)
    return rows


def failures_of(planned: list[Planned], config: Config) -> list[str]:
    """Why the run fails: a job or the comparison that did not succeed, a parity that did not
    pass, or a job skipped in gpu mode (every one of them runs on a GPU)."""
    failures = []
    for job in planned:
        if job.skipped:
            if config.hardware == "gpu":
                failures.append(f"{job.name}: the spec is refused on gpu: {job.skipped}")
            continue
        if job.final is None:
            why = job.error or ("never finished: the check stopped first" if job.id else "never submitted")
            failures.append(f"{job.name}: {why}")
            continue
        final = job.final or {}
        if final.get("status") != JobStatus.SUCCEEDED:
            error = final.get("error") or {}
            if job.kind == "comparison":
                sides = [
                    f"{fw} {j['status']}"
                    + (f" ({j['error']['type']}: {j['error']['message']})" if j.get("error") else "")
                    for fw, j in (final.get("jobs") or {}).items()
                ]
                failures.append(f"{job.name}: {final.get('status')}: {error.get('message', '')} [{'; '.join(sides)}]")
            else:
                failures.append(
                    f"{job.name}: {final.get('status')}: {error.get('type', '')}: {error.get('message', '')}"
                )
        elif job.kind == "comparison" and not (final.get("parity") or {}).get("passed"):
            failures.append(f"{job.name}: parity did not pass: {(final.get('parity') or {}).get('message')}")
    return failures


def print_tables(results: dict, console: Console) -> None:
    from rich.table import Table

    def num(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    machine = results["machine"]
    where = machine["gpu"]["name"] if machine.get("gpu") else f"{machine['cpus']} CPU cores"
    jobs = Table(title=f"trainhub gpu-check ({results['hardware']} mode) on {where}")
    for column in ("job", "status", "setup s", "compile s", "first epoch s", "steady s/epoch", "samples/s", "test acc"):
        jobs.add_column(column, justify="left" if column in ("job", "status") else "right")
    for job in results["jobs"]:
        if job["kind"] == "comparison":
            continue
        if job["skipped"]:
            jobs.add_row(job["name"], "skipped", "-", "-", "-", "-", "-", "-")
            continue
        timings = job.get("timings") or {}
        speeds = [s for s in job.get("samples_per_s") or [] if s]
        jobs.add_row(
            job["name"],
            job.get("status") or "error",
            num(timings.get("setup_s"), 2),
            num(timings.get("compile_s"), 2),
            num(timings.get("first_epoch_s")),
            num(timings.get("steady_epoch_s")),
            f"{max(speeds):,.0f}" if speeds else "-",
            num(job.get("test_accuracy"), 4),
        )
    console.print(jobs)

    gpu = results["hardware"] == "gpu"
    unit = "TFLOP/s" if gpu else "GFLOP/s"
    large = Table(title=f"large MLP {results['config']['large_hidden']}, batch {results['config']['large_batch']}")
    columns = ["job", "FLOP/epoch", "steady s/epoch", unit]
    columns += ["of bf16 peak", "of fp32 peak", "of TF32 peak", "of matmul"] if gpu else ["of matmul"]
    for column in columns:
        large.add_column(column, justify="left" if column == "job" else "right")
    for row in results["large_mlp"]:
        achieved = row.get("achieved_tflops" if gpu else "achieved_gflops")
        cells = [row["name"], f"{row['flops']:.3g}", num(row.get("steady_epoch_s")), num(achieved, 1)]
        if gpu:
            of_peak = row.get("of_peak") or {}
            cells += [_pct(of_peak.get(k)) for k in ("bf16", "fp32", "tf32")]
        cells.append(_pct(row.get("of_matmul")))
        large.add_row(*cells)
    console.print(large)
    if gpu and results.get("peak"):
        p = results["peak"]
        console.print(
            f"peaks: bf16 {p['bf16']:g}, TF32 {p['tf32']:g}, fp32 {p['fp32']:g} TFLOP/s ({p['source']})", markup=False
        )
    matmul = machine.get("matmul") or {}
    if gpu and matmul.get("tflops"):
        rates = ", ".join(f"{k} {v:.0f}" for k, v in matmul["tflops"].items())
        console.print(f"measured matmul TFLOP/s: {rates}", markup=False)
    elif matmul.get("fp32_gflops"):
        console.print(f"measured matmul: {matmul['fp32_gflops']:.0f} GFLOP/s fp32 ({matmul['what']})", markup=False)

    from app.cli import comparison_table

    for job in results["jobs"]:
        if job["kind"] == "comparison" and job.get("table"):
            console.print(comparison_table(job))
        if job["kind"] == "comparison" and not job["skipped"]:
            parity = job.get("parity") or {}
            checks = ", ".join(
                f"{c['name']} {c['value']:.3g} ({'ok' if c['passed'] else 'FAIL'})" for c in parity.get("checks", [])
            )
            console.print(
                f"comparison {job.get('status') or job.get('error')}: parity "
                f"{'passed' if parity.get('passed') else 'FAILED'}: {parity.get('message', '-')} [{checks}]",
                markup=False,
            )
    for job in results["jobs"]:
        if job["skipped"]:
            console.print(f"[yellow]skipped[/yellow] {escape(job['name'])}: {escape(job['skipped'])}")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f} %"


def write_json(path: Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(results, indent=2, default=str) + "\n")
    tmp.replace(path)


# --- main ----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__.splitlines()[0])
    parser.add_argument("--hardware", choices=["gpu", "cpu"], default="gpu")
    parser.add_argument(
        "--out", type=Path, default=None, help="default: bench/gpu_check.json (cpu: gpu_check-cpu.json)"
    )
    parser.add_argument("--epochs", type=int, default=None, help="of the Fashion-MNIST jobs (default: gpu 5, cpu 2)")
    parser.add_argument("--quick", action="store_true", help="every part at small sizes: a smoke test")
    parser.add_argument("--var-dir", type=Path, default=None, help="the stack's files (default: a temporary folder)")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--matmul-sizes", default="8192", help=argparse.SUPPRESS)
    parser.add_argument("--matmul-repeats", type=int, default=10, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.epochs is not None and args.epochs < 1:
        parser.error("--epochs must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.probe:  # the child process of run_probe
        sizes = [int(n) for n in args.matmul_sizes.split(",")]
        print(PROBE_PREFIX + json.dumps(probe(args.hardware, sizes, args.matmul_repeats)), flush=True)
        return 0

    from rich.console import Console

    from app.client import TrainhubClient

    console = Console(width=None if sys.stdout.isatty() else 150)
    config = Config.for_mode(args.hardware, args.quick, args.epochs)
    out = args.out or DEFAULT_OUT[config.hardware]
    started = time.monotonic()
    results: dict = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "hardware": config.hardware,
        "quick": config.quick,
        "config": asdict(config),
        "machine": {
            "hostname": platform.node(),
            "platform": platform.platform(),
            "cpus": len(os.sched_getaffinity(0)),
            "load_average_start": load_average(),
        },
    }
    own_var_dir = args.var_dir is None
    var_dir = (Path(tempfile.mkdtemp(prefix="trainhub-gpu-check-")) if own_var_dir else args.var_dir).resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    env = child_env(var_dir)
    failures: list[str] = []
    planned: list[Planned] = []
    running = None
    peak = None
    try:
        if config.hardware == "gpu":
            results["machine"]["gpu"] = gpu_info()
            peak = peak_for(results["machine"]["gpu"]["name"])
            results["peak"] = asdict(peak) if peak else None
            if peak is None:
                console.print(
                    f"[yellow]no peak figures for {escape(results['machine']['gpu']['name'])} in PEAKS[/yellow]"
                )
        console.print(f"measuring matmul rates and versions ({config.hardware}) …")
        measured = run_probe(config, env)
        results["versions"] = measured["versions"]
        results["machine"]["matmul"] = measured["matmul"]
        for framework, error in (measured["matmul"].get("errors") or {}).items():
            console.print(f"[yellow]no {framework} matmul rate on the GPU[/yellow]: {escape(error)}")
        if config.hardware == "gpu":
            results["versions"]["cuda_driver_api"] = results["machine"]["gpu"]["cuda_driver_api"]
            results["versions"]["nvidia_driver"] = results["machine"]["gpu"]["driver"]

        console.print(f"starting the embedded stack under {var_dir} …", markup=False)
        secret = create_key(env, var_dir)
        running = start_stack(config, env, var_dir)
        running.wait_ready(timeout_s=180)
        with TrainhubClient(running.url, secret, timeout_s=60) as client:
            worker = wait_for_worker(client, running, config.hardware)
            results["worker"] = {k: worker.get(k) for k in ("hardware", "queues", "devices", "versions")}
            console.print(
                f"worker online: {', '.join(worker['queues'])} on {', '.join(worker['devices'])}", markup=False
            )
            planned = plan_jobs(config)
            submit_all(client, planned)
            console.print(
                f"{sum(1 for j in planned if j.id)} submitted, {sum(1 for j in planned if j.skipped)} skipped"
            )
            samples = wait_all(client, planned, config, console, running)
            if config.hardware == "gpu":
                results["gpu_samples"] = samples
    except Exception as exc:  # any failure is reported, written and exits 1
        failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        if running is not None:
            running.stop()
    failures += failures_of(planned, config)
    results["jobs"] = [job_record(job) for job in planned]
    results["skipped"] = [{"name": j.name, "reason": j.skipped} for j in planned if j.skipped]
    results["large_mlp"] = large_mlp_rates(planned, config, peak, results["machine"].get("matmul") or {})
    if config.hardware == "gpu" and results.get("gpu_samples"):
        samples = results["gpu_samples"]
        results["machine"]["gpu_under_load"] = {
            key: max((s[key] for s in samples if s.get(key) is not None), default=None)
            for key in ("sm_clock_mhz", "power_w", "utilization_pct", "memory_used_mib")
        }
    results["machine"]["load_average_end"] = load_average()
    results["failures"] = failures
    results["ok"] = not failures
    results["wall_s"] = round(time.monotonic() - started, 1)
    if failures and running is not None:
        results["logs"] = {child.name: log_tail(child.log_path, 60) for child in running.children}
    write_json(out, results)

    if planned:
        print_tables(results, console)
    if failures:
        for failure in failures:
            console.print(f"[red]FAIL[/red] {escape(failure)}")
        worker_log = running.children[-1].log_path if running is not None else None
        if worker_log is not None and log_tail(worker_log) not in "\n".join(failures):
            console.print(f"end of the worker's log ({worker_log}):\n{log_tail(worker_log)}", markup=False)
        where = f"results in {out}"
        if running is None and own_var_dir:  # it failed before the stack started: nothing to read there
            shutil.rmtree(var_dir, ignore_errors=True)
        else:
            where += f"; the stack's files and logs in {var_dir}"
        console.print(f"[red]gpu-check failed[/red] ({results['wall_s']:.0f} s); {escape(where)}")
        return 1
    if own_var_dir:
        shutil.rmtree(var_dir, ignore_errors=True)
    console.print(f"[green]gpu-check passed[/green] ({results['wall_s']:.0f} s); results in {escape(str(out))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
