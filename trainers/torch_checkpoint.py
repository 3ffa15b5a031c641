"""Checkpoints of a PyTorch run: model, optimizer (and scheduler) state dicts, epoch and metrics.

Written to a temporary file and renamed over the previous checkpoint, so a crash mid-save
leaves the previous one whole; loaded with `weights_only=True` (nothing is unpickled).
The RNG needs no saving: dropout seeds and batch order are functions of (seed, epoch).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from trainers.base import EpochMetrics

CHECKPOINT_FILE = "checkpoint.pt"


def save(
    workdir: Path,
    epoch: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    metrics: list[EpochMetrics],
    first_step_loss: float,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> None:
    """Save the run after `epoch` (counting from 1), replacing the previous checkpoint atomically."""
    payload = {
        "epoch": epoch,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "metrics": [m.to_dict() for m in metrics],
        "first_step_loss": first_step_loss,
    }
    if scheduler is not None:  # the learning-rate schedule's step count
        payload["scheduler"] = scheduler.state_dict()
    path = workdir / CHECKPOINT_FILE
    partial = path.with_suffix(".partial")
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
) -> tuple[list[EpochMetrics], float] | None:
    """Load the latest checkpoint into `model` and `optimizer`; (metrics, first_step_loss), or
    None when there is none."""
    path = workdir / CHECKPOINT_FILE
    if not path.is_file():
        return None
    payload = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(payload["model"])
    optimizer.load_state_dict(payload["optimizer"])
    if scheduler is not None and "scheduler" in payload:
        scheduler.load_state_dict(payload["scheduler"])
    return [EpochMetrics(**m) for m in payload["metrics"]], payload["first_step_loss"]
