"""Pin a worker to its hardware before any framework is imported, then check what it can serve.

`pin` only sets environment variables, so it must run before jax or torch is imported in the
process; `detect` asks each framework whether it really sees the hardware (on gpu and tpu by
importing it; on cpu, where both always run, it only checks that each is installed).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import sys
from dataclasses import dataclass, field

from app.queue import queues_served


def pin(hardware: str, devices: list[int] | None, cpu_devices: int = 1) -> None:
    """Restrict this process to `devices` of `hardware` (all when None). On cpu, `cpu_devices`
    is how many devices its cores count as for data parallel jobs: XLA host devices for JAX
    (--xla_force_host_platform_device_count) and DDP processes for PyTorch; 1 (the default)
    keeps one JAX device that uses every core.

    Raises RuntimeError when a framework was imported already (pinning would come too late) and
    ValueError when cpu_devices is more than the cores the process owns.
    """
    imported = [m for m in ("jax", "torch") if m in sys.modules]
    if imported:
        raise RuntimeError(f"pin() must run before {', '.join(imported)} is imported")
    if hardware == "gpu":
        if devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        # Several workers may share a card: allocate on demand instead of 75% up front (an
        # operator may set XLA_PYTHON_CLIENT_MEM_FRACTION instead, e.g. 0.45 for two per card).
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        # Named explicitly, a platform that fails to start is an error, not a warning followed by
        # the CPU (jax's fallback when it picks the platform itself).
        os.environ.setdefault("JAX_PLATFORMS", "cuda,cpu")
        # fp32 means fp32: JAX would run fp32 matmuls as TF32 on Ampere and later, PyTorch does
        # not (allow_tf32 is off), and a comparison's parity check would see the difference.
        # bf16 jobs ask for bfloat16 themselves.
        os.environ.setdefault("JAX_DEFAULT_MATMUL_PRECISION", "highest")
    elif hardware == "tpu":
        if devices is not None:
            os.environ["TPU_VISIBLE_CHIPS"] = ",".join(map(str, devices))
            os.environ["TPU_PROCESS_BOUNDS"] = "1,1,1"
            os.environ["TPU_CHIPS_PER_PROCESS_BOUNDS"] = f"1,{len(devices)},1"
        os.environ.setdefault("JAX_PLATFORMS", "tpu,cpu")
    else:
        if devices is not None:
            os.sched_setaffinity(0, devices)
        cores = len(os.sched_getaffinity(0))
        if not 1 <= cpu_devices <= cores:
            raise ValueError(f"--cpu-devices {cpu_devices} must be between 1 and the {cores} core(s) this worker owns")
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = str(cores)
        os.environ["XLA_FLAGS"] = xla_cpu_flags(os.environ.get("XLA_FLAGS", ""), cpu_devices)
        # A cpu worker must never grab a GPU by accident.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ["JAX_PLATFORMS"] = "cpu"
        # Inductor's CPU code is C++, never Triton; yet torch's CUDA build imports triton and hashes
        # it for a cache key the CPU path then drops (~0.35 s of a fresh worker's first "compile"
        # job, its FX graph cache warm). Unimportable here, Inductor sees no Triton.
        sys.modules.setdefault("triton", None)  # type: ignore[arg-type]
        # ...which torch's flop counter would then warn about, once, at the first compile job.
        logging.getLogger("torch.utils.flop_counter").setLevel(logging.ERROR)


# XLA's CPU dots through Eigen rather than YNNPACK's fusions: the JAX trainer's MLP epoch ran ~10%
# faster on a 2-core AMD EPYC (Zen 3), measured in turns with the default; the CNN's step the same.
EIGEN_DOTS = "--xla_cpu_experimental_ynn_fusion_type="


def xla_cpu_flags(flags: str, cpu_devices: int) -> str:
    """XLA_FLAGS `flags` for a cpu worker (or a bench loop training as one): its host device count
    when above 1 (replacing any), and EIGEN_DOTS unless `flags` choose YNNPACK's fusions themselves."""
    kept = [f for f in flags.split() if "host_platform_device_count" not in f]
    if cpu_devices > 1:
        kept.append(f"--xla_force_host_platform_device_count={cpu_devices}")
    if not any("xla_cpu_experimental_ynn_fusion_type" in f for f in kept):
        kept.append(EIGEN_DOTS)
    return " ".join(kept)


@dataclass
class Capabilities:
    """What a pinned worker can serve: queues like `cpu.jax` (and `cpu.jax.x2` with two devices:
    app.queue.queues_served), its devices and versions."""

    hardware: str
    queues: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # framework -> why it is not served


def detect(hardware: str, frameworks: list[str], cpu_devices: int = 1) -> Capabilities:
    """Keep the frameworks that really use `hardware`: on gpu and tpu, each is imported and asked
    for its devices; on cpu, which every build of both runs on, each need only be installed (its
    cores count as `cpu_devices` devices, as pin() set them up), so the worker is online without
    importing either, and its first job imports only its own framework."""
    caps = Capabilities(hardware=hardware)
    for framework in frameworks:
        try:
            if hardware == "cpu":
                devices, version = _check_installed(framework, cpu_devices)
            elif framework == "jax":
                devices, version = _check_jax(hardware)
            else:
                devices, version = _check_torch(hardware, cpu_devices)
        except Exception as exc:  # an import error or a missing device: not served
            caps.refused[framework] = f"{type(exc).__name__}: {exc}"
            continue
        caps.queues.extend(queues_served(hardware, framework, len(devices)))
        caps.versions[framework] = version
        caps.devices = sorted(set(caps.devices) | set(devices))
    return caps


def _check_installed(framework: str, cpu_devices: int) -> tuple[list[str], str]:
    module = {"jax": "jax", "pytorch": "torch"}[framework]
    if importlib.util.find_spec(module) is None:
        raise RuntimeError(f"{module} is not installed (pip install {module})")
    return [f"cpu:{i}" for i in range(cpu_devices)], importlib.metadata.version(module)


def _check_jax(hardware: str) -> tuple[list[str], str]:
    import jax

    hints = {
        "gpu": "jax needs its CUDA plugin (pip install 'jax[cuda12]') and an NVIDIA driver (nvidia-smi)",
        "tpu": "jax needs libtpu (pip install 'jax[tpu]') on a TPU VM",
    }
    try:
        devices = jax.devices(hardware)  # raises RuntimeError when the backend is missing
    except RuntimeError as exc:
        raise RuntimeError(
            f"jax {jax.__version__} has no {hardware} backend ({exc}); {hints.get(hardware, '')}"
        ) from exc
    if not devices:
        raise RuntimeError(f"jax sees no {hardware} device")
    # The trainer runs on the default backend: it must be this hardware, not a CPU fallback.
    if jax.default_backend() != hardware:
        raise RuntimeError(f"jax's default backend is {jax.default_backend()}, not {hardware}")
    return [f"{hardware}:{d.id}" for d in devices], jax.__version__


def _check_torch(hardware: str, cpu_devices: int = 1) -> tuple[list[str], str]:
    import torch

    if hardware == "cpu":  # DDP runs one process per device, each on its own core
        return [f"cpu:{i}" for i in range(cpu_devices)], torch.__version__
    if hardware == "gpu":
        if not torch.cuda.is_available():
            build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
            raise RuntimeError(
                f"torch {torch.__version__} ({build}): torch.cuda.is_available() is False "
                "(no CUDA device visible, or no NVIDIA driver)"
            )
        return [f"gpu:{i}" for i in range(torch.cuda.device_count())], torch.__version__
    try:
        import torch_xla  # noqa: F401  PyTorch on TPU needs torch_xla
    except ImportError as exc:
        raise RuntimeError(
            f"torch {torch.__version__}: PyTorch on TPU needs torch_xla, which is not installed"
        ) from exc
    import torch_xla.core.xla_model as xm

    return [f"tpu:{i}" for i in range(len(xm.get_xla_supported_devices()))], torch.__version__
