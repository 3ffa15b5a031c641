"""Checkpoints of a JAX run with orbax: the TrainState (params, opt_state, step) and the metrics.

Orbax writes each checkpoint into a temporary folder and renames it when complete, so a crash
mid-save leaves the previous checkpoint as the latest; a half-written one is never restored.
The RNG needs no saving: dropout keys and batch order are functions of (seed, epoch).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import jax
import orbax.checkpoint as ocp

from trainers.base import EpochMetrics

if TYPE_CHECKING:  # for annotations only: no import at run time
    from flax.training.train_state import TrainState

CHECKPOINT_DIR = "checkpoints"


def _manager(workdir: Path) -> ocp.CheckpointManager:
    # Synchronous: the next chunk donates the state's buffers, so a save must be done first.
    options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False)
    return ocp.CheckpointManager((workdir / CHECKPOINT_DIR).resolve(), options=options)


def save(workdir: Path, epoch: int, state: TrainState, metrics: list[EpochMetrics], first_step_loss: float) -> None:
    """Save the state after `epoch` (counting from 1), replacing the previous checkpoint."""
    meta = {"epoch": epoch, "metrics": [m.to_dict() for m in metrics], "first_step_loss": first_step_loss}
    with _manager(workdir) as manager:
        manager.save(epoch, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
        manager.wait_until_finished()


def restore(workdir: Path, state: TrainState) -> tuple[TrainState, list[EpochMetrics], float] | None:
    """(state, metrics, first_step_loss) of the latest complete checkpoint, shaped like `state`;
    None when there is none."""
    with _manager(workdir) as manager:
        epoch = manager.latest_step()
        if epoch is None:
            return None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        restored = manager.restore(
            epoch, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
    meta = restored.meta
    return restored.state, [EpochMetrics(**m) for m in meta["metrics"]], meta["first_step_loss"]
