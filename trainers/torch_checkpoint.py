"""Checkpoints of a PyTorch run: model, optimizer (and scheduler) state dicts, epoch and metrics,
after each epoch, or mid-epoch with where the epoch stood (Progress) when the run was handed back.

Written to a temporary file and renamed over the previous checkpoint, so a crash mid-save
leaves the previous one whole; loaded with `weights_only=True` (nothing is unpickled: tensors
and plain types only). At an epoch's end the RNG needs no saving: batch order is a function of
(seed, epoch) and dropout's generator is seeded from them when an epoch starts. Mid-epoch, the
generators' states are part of the Progress.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields
from pathlib import Path

import torch

from trainers.base import CHECKPOINT_FILE, CHECKPOINT_PARTIAL, EpochMetrics


@dataclass
class Progress:
    """Where an unfinished epoch stood: `step` of its steps done (the next one to run), the running
    sums of its batch losses and scores (0-dim tensors, as train_epoch keeps them), its training
    seconds so far, the learning rate of its first step (the metrics report it), and the states of
    the generators dropout draws from: torch's CPU one, and the CUDA device's when it trains there."""

    epoch: int
    step: int
    loss_sum: torch.Tensor
    correct: torch.Tensor
    elapsed_s: float
    learning_rate: float
    cpu_rng: torch.Tensor
    cuda_rng: torch.Tensor | None = None


def save(
    workdir: Path,
    epoch: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    metrics: list[EpochMetrics],
    first_step_loss: float,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    progress: Progress | None = None,
) -> None:
    """Save the run after `epoch` (counting from 1) and, with `progress`, part of the next one,
    replacing the previous checkpoint atomically."""
    payload: dict = {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "metrics": [m.to_dict() for m in metrics],
        "first_step_loss": first_step_loss,
    }
    if scheduler is not None:  # the learning-rate schedule's step count
        payload["scheduler"] = scheduler.state_dict()
    if progress is not None:
        payload["progress"] = {
            f.name: value.cpu() if isinstance(value := getattr(progress, f.name), torch.Tensor) else value
            for f in fields(progress)
        }
    path = workdir / CHECKPOINT_FILE
    partial = workdir / CHECKPOINT_PARTIAL
    with open(partial, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def restore(
    workdir: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> tuple[list[EpochMetrics], float, Progress | None] | None:
    """Load the latest checkpoint into `model` and `optimizer`; (metrics, first_step_loss,
    progress: None after a whole epoch), or None when there is none."""
    path = workdir / CHECKPOINT_FILE
    if not path.is_file():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    if scheduler is not None and "scheduler" in payload:
        scheduler.load_state_dict(payload["scheduler"])
    progress = payload.get("progress")  # absent in checkpoints written at an epoch's end
    return (
        [EpochMetrics(**m) for m in payload["metrics"]],
        payload["first_step_loss"],
        Progress(**progress) if progress else None,
    )
