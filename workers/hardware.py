"""Pin a worker to its hardware before any framework is imported, then check what it can serve.

`pin` only sets environment variables, so it must run before jax or torch is imported in the
process; `detect` imports the frameworks and asks each whether it really sees the hardware.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

FRAMEWORKS = ("jax", "pytorch")


def pin(hardware: str, devices: list[int] | None) -> None:
    """Restrict this process to `devices` of `hardware` (all when None).

    Raises RuntimeError when a framework was imported already: pinning would come too late.
    """
    imported = [m for m in ("jax", "torch") if m in sys.modules]
    if imported:
        raise RuntimeError(f"pin() must run before {', '.join(imported)} is imported")
    if hardware == "gpu":
        if devices is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        # Several workers may share a card: allocate on demand instead of 75% up front.
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    elif hardware == "tpu":
        if devices is not None:
            os.environ["TPU_VISIBLE_CHIPS"] = ",".join(map(str, devices))
            os.environ["TPU_PROCESS_BOUNDS"] = "1,1,1"
            os.environ["TPU_CHIPS_PER_PROCESS_BOUNDS"] = f"1,{len(devices)},1"
    else:
        if devices is not None:
            os.sched_setaffinity(0, devices)
        threads = str(len(os.sched_getaffinity(0)))
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
            os.environ[var] = threads
        # A cpu worker must never grab a GPU by accident.
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        os.environ["JAX_PLATFORMS"] = "cpu"


@dataclass
class Capabilities:
    """What a pinned worker can serve: queues like `cpu.jax`, its devices and versions."""

    hardware: str
    queues: list[str] = field(default_factory=list)
    devices: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)  # framework -> why it is not served


def detect(hardware: str, frameworks: list[str]) -> Capabilities:
    """Import each framework and keep those that really use `hardware`."""
    caps = Capabilities(hardware=hardware)
    for framework in frameworks:
        check = _check_jax if framework == "jax" else _check_torch
        try:
            devices, version = check(hardware)
        except Exception as exc:  # an import error or a missing device: not served
            caps.refused[framework] = f"{type(exc).__name__}: {exc}"
            continue
        caps.queues.append(f"{hardware}.{framework}")
        caps.versions[framework] = version
        caps.devices = sorted(set(caps.devices) | set(devices))
    return caps


def _check_jax(hardware: str) -> tuple[list[str], str]:
    import jax

    platform = {"cpu": "cpu", "gpu": "gpu", "tpu": "tpu"}[hardware]
    devices = jax.devices(platform)  # raises RuntimeError when the backend is missing
    if not devices:
        raise RuntimeError(f"jax sees no {hardware} device")
    return [f"{hardware}:{d.id}" for d in devices], jax.__version__


def _check_torch(hardware: str) -> tuple[list[str], str]:
    import torch

    if hardware == "cpu":
        return ["cpu:0"], torch.__version__
    if hardware == "gpu":
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False (no CUDA device or driver)")
        return [f"gpu:{i}" for i in range(torch.cuda.device_count())], torch.__version__
    import torch_xla  # noqa: F401  PyTorch on TPU needs torch_xla
    import torch_xla.core.xla_model as xm

    return [f"tpu:{i}" for i in range(len(xm.get_xla_supported_devices()))], torch.__version__
