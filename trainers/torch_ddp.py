"""Data parallel PyTorch: DistributedDataParallel over `spec.devices` processes, one per device.

Like `torchrun`, one process (rank) per device: on cpu each rank is pinned to one of the cores
this process owns and talks over gloo; on gpu each takes one visible CUDA device and talks over
NCCL. Every rank runs `torch_trainer.train` on its equal share of every global batch (the same
`epoch_batches` order as one device); DDP averages the gradients during the backward pass, so
each optimizer step is the step one device takes on the whole batch, up to the order of float
sums. Batch norm is synchronised over the ranks (SyncBatchNorm, gpu only), so its statistics are
the global batch's too.

The calling process only supervises: rank 0 sends each epoch's metrics and the final result
over a queue, and this process passes them to `report` and returns the FitResult. Between
messages it calls `should_stop`; to stop, it raises a shared flag that the ranks read every
torch_trainer.STOP_CHECK_STEPS steps and agree on with an all-reduce, so they all stop after the same step.
A rank that fails sends its error, and the run raises it here; a rank that dies is an error too.
Ranks die with this process (PR_SET_PDEATHSIG), so a killed worker leaves none behind.

A run handed back (preempted, or its worker shutting down) resumes from its last epoch's
checkpoint, redoing the steps of the epoch it was in: unlike one device (torch_trainer), no
mid-epoch checkpoint is written, which would need every rank's RNG state and running sums
gathered on rank 0, and the stop flag does not say why the run stops.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import os
import queue
import signal
import socket
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from trainers.base import (
    EpochMetrics,
    FitResult,
    HardwareMismatch,
    NanLoss,
    Report,
    RunOptions,
    ShouldStop,
    StopTraining,
)
from trainers.spec import JobSpec

if TYPE_CHECKING:  # for annotations only: no import at run time
    from multiprocessing.queues import Queue
    from multiprocessing.sharedctypes import Synchronized

POLL_S = 0.25  # how often the supervisor asks should_stop while no message arrives
EXIT_WAIT_S = 60.0  # how long stopped ranks get to leave before they are killed


def fit(spec: JobSpec, workdir: Path, report: Report, should_stop: ShouldStop, options: RunOptions) -> FitResult:
    """Train `spec` on `spec.devices` devices with DDP, as torch_trainer.fit does on one.

    Raises HardwareMismatch when this process owns fewer devices (cpu: cores) than asked for,
    DataNotFound when the dataset is missing (before any rank starts), NanLoss or RuntimeError
    when a rank fails, and lets StopTraining from the hooks propagate once every rank stopped.
    """
    from trainers.data import load_dataset

    start = time.perf_counter()
    devices = _owned_devices(spec)
    # A missing dataset fails here, once, not in every rank.
    load_dataset(spec.dataset, options.data_dir, options.dataset_file)
    context = mp.get_context("spawn")  # a fresh interpreter per rank: no forked CUDA or thread state
    messages, stop = context.Queue(), context.Value("b", 0)
    port = _free_port()
    ranks = [
        context.Process(
            target=_rank_main,
            name=f"trainhub-ddp-rank{rank}",
            daemon=True,
            args=(rank, spec.model_dump(mode="json"), str(workdir), port, devices, messages, stop, start, options),
        )
        for rank in range(spec.devices)
    ]
    for process in ranks:
        process.start()
    try:
        return _supervise(ranks, messages, report, should_stop)
    except StopTraining:
        stop.value = 1
        _wait_for_exit(ranks, EXIT_WAIT_S)
        raise
    finally:
        stop.value = 1
        _wait_for_exit(ranks, 5.0)
        for process in ranks:
            if process.is_alive():
                process.kill()


def _owned_devices(spec: JobSpec) -> list[int]:
    """The device index of each rank: cores this process may run on (cpu) or CUDA devices (gpu)."""
    if spec.hardware == "cpu":
        owned = sorted(os.sched_getaffinity(0))
        found = f"{len(owned)} cpu cores"
    elif spec.hardware == "gpu":
        owned = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
        found = f"{len(owned)} cuda devices"
    else:
        raise HardwareMismatch(f"{spec.devices} tpu devices", "no DDP for torch_xla in trainhub", "torch")
    if len(owned) < spec.devices:
        raise HardwareMismatch(f"{spec.devices} {spec.hardware} devices", found, "torch")
    return owned[: spec.devices]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _supervise(ranks: list, messages: Queue[tuple[str, dict]], report: Report, should_stop: ShouldStop) -> FitResult:
    """Relay rank 0's epochs to `report` until its result arrives; raise a rank's error."""
    while True:
        try:
            kind, payload = messages.get(timeout=POLL_S)
        except queue.Empty:
            should_stop()
            for rank, process in enumerate(ranks):
                if process.exitcode not in (None, 0):
                    raise RuntimeError(
                        f"DDP rank {rank} exited with code {process.exitcode} before the run ended"
                    ) from None
            continue
        if kind == "epoch":
            report(payload["epoch"], EpochMetrics(**payload))
        elif kind == "error":
            raise _error(payload)
        else:
            payload["metrics"] = [EpochMetrics(**m) for m in payload["metrics"]]
            return FitResult(**payload)


def _error(payload: dict) -> Exception:
    """The exception a rank reported, as the runner names errors (app/failures.py): NanLoss and
    the out-of-memory errors keep their type; any other is a RuntimeError naming it."""
    said = f"DDP rank {payload['rank']}: {payload['message']}"
    if payload["type"] == "NanLoss":
        return NanLoss(payload["epoch"], payload["value"], payload["metric"])
    if payload["type"] == "MemoryError":
        return MemoryError(said)
    if payload["type"] == "OutOfMemoryError":
        return torch.OutOfMemoryError(said)
    return RuntimeError(f"DDP rank {payload['rank']}: {payload['type']}: {payload['message']}")


def _wait_for_exit(ranks: list, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    for process in ranks:
        process.join(max(0.0, deadline - time.monotonic()))


class Group:
    """One rank's world: its device, its share of each batch, DDP, and sums over all ranks."""

    timed_stop_checks = False  # the ranks agree on stopping with an all-reduce: same steps on every rank

    def __init__(self, rank: int, size: int, device: torch.device) -> None:
        self.rank, self.size, self.device = rank, size, device

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Batch norm over the global batch (SyncBatchNorm; CUDA only, cpu specs are refused)."""
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) if self.device.type == "cuda" else model

    def wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    def shard(self, batches: torch.Tensor) -> torch.Tensor:
        share = batches.shape[1] // self.size
        return batches[:, self.rank * share : (self.rank + 1) * share]

    def total(self, *values: torch.Tensor) -> list[float]:
        summed = self.all_sum(torch.stack([v.detach().to(torch.float64) for v in values]))
        return summed.tolist()

    def all_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)
        return tensor

    def devices(self) -> list[str]:
        return [f"{self.device.type}:{i}" for i in range(self.size)]

    def agree_to_stop(self, flag: Synchronized[int]) -> bool:
        """Whether any rank saw the supervisor's stop flag (every rank must call it together)."""
        seen = torch.tensor([float(flag.value)], device=self.device)
        dist.all_reduce(seen, op=dist.ReduceOp.MAX)
        return bool(seen.item())


class _Stopped(Exception):
    """The ranks agreed to stop; the supervisor already knows why."""


def _rank_main(
    rank: int,
    spec_json: dict,
    workdir: str,
    port: int,
    devices: list[int],
    messages: Queue[tuple[str, dict]],
    stop: Synchronized[int],
    start: float,
    options: RunOptions,
) -> None:
    """One rank, in its own process: join the group, train, send rank 0's results."""
    _die_with_parent()
    size = len(devices)
    try:
        device = _bind(spec_json["hardware"], devices[rank])
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=size,
            timeout=timedelta(minutes=10),
        )
        result = _train_rank(
            rank, size, device, JobSpec.model_validate(spec_json), Path(workdir), messages, stop, start, options
        )
        if rank == 0 and result is not None:
            messages.put(
                (
                    "result",
                    {
                        "metrics": [m.to_dict() for m in result.metrics],
                        "timings": result.timings,
                        "result": result.result,
                        "artifacts": result.artifacts,
                        "device": result.device,
                    },
                )
            )
    except _Stopped:
        pass
    except BaseException as exc:  # sent, so the supervisor fails the job with the real cause
        payload = {
            "rank": rank,
            "type": type(exc).__name__,
            "message": str(exc) or repr(exc),
            "traceback": traceback.format_exc(),
        }
        if isinstance(exc, NanLoss):
            payload.update(epoch=exc.epoch, value=exc.value, metric=exc.metric)
        messages.put(("error", payload))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        messages.close()
        messages.join_thread()


def _bind(hardware: str, index: int) -> torch.device:
    """Pin this rank to its device: one core and one thread (cpu), or one CUDA device."""
    if hardware == "cpu":
        os.sched_setaffinity(0, {index})
        torch.set_num_threads(1)
        return torch.device("cpu")
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def _train_rank(
    rank: int,
    size: int,
    device: torch.device,
    spec: JobSpec,
    workdir: Path,
    messages: Queue[tuple[str, dict]],
    stop: Synchronized[int],
    start: float,
    options: RunOptions,
) -> FitResult | None:
    from trainers import torch_trainer

    group = Group(rank, size, device)

    def report(epoch: int, metrics: EpochMetrics) -> None:
        if rank == 0:
            messages.put(("epoch", metrics.to_dict()))

    def should_stop() -> None:  # called every torch_trainer.STOP_CHECK_STEPS steps, by every rank
        if group.agree_to_stop(stop):
            raise _Stopped()

    return torch_trainer.train(spec, workdir, report, should_stop, group, start, options)


def _die_with_parent() -> None:
    """Have Linux kill this rank when the process that started it dies (PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        pass
