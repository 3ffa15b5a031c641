"""Checkpoints of a JAX run with orbax: the TrainState (params, opt_state, step) and the metrics,
after each epoch, or mid-epoch with where the epoch stood (Progress) when the run was handed back.

Orbax writes each checkpoint into a temporary folder and renames it when complete, so a crash
mid-save leaves the previous checkpoint as the latest; a half-written one is never restored.
Checkpoints are numbered by the state's optimizer step, so a mid-epoch one sorts between the
epochs around it. The RNG needs no saving: dropout keys and batch order are functions of
(seed, epoch, step).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import jax

from trainers.base import CHECKPOINT_DIR, EpochMetrics

if TYPE_CHECKING:  # for annotations only: no import at run time
    import orbax.checkpoint as ocp
    from flax.training.train_state import TrainState


@dataclass(frozen=True)
class Progress:
    """Where an unfinished epoch stood: `step` of its steps done (the next one to run),
    `totals` their running sums as train_chunk keeps them (float32 [3]: batch losses, correct
    predictions, step 0's loss) and `elapsed_s`, its training seconds so far."""

    epoch: int
    step: int
    totals: tuple[float, float, float]
    elapsed_s: float


def _manager(workdir: Path) -> ocp.CheckpointManager:
    # Orbax is imported at the first checkpoint (or restore of one): ~0.5 s a fresh worker's
    # first job need not wait for when it writes none (one epoch) and resumes from none.
    import orbax.checkpoint as ocp

    # Synchronous: the next chunk donates the state's buffers, so a save must be done first.
    options = ocp.CheckpointManagerOptions(max_to_keep=1, enable_async_checkpointing=False)
    return ocp.CheckpointManager((workdir / CHECKPOINT_DIR).resolve(), options=options)


def save(
    workdir: Path,
    state: TrainState,
    metrics: list[EpochMetrics],
    first_step_loss: float,
    progress: Progress | None = None,
) -> None:
    """Save the state after the epochs of `metrics` (and, with `progress`, part of the next one),
    replacing the previous checkpoint. `state.step` must have grown since the last save."""
    meta = {
        "epoch": len(metrics),
        "metrics": [m.to_dict() for m in metrics],
        "first_step_loss": first_step_loss,
        "progress": asdict(progress) if progress else None,
    }
    import orbax.checkpoint as ocp

    with _manager(workdir) as manager:
        manager.save(
            int(state.step),
            args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)),
        )
        manager.wait_until_finished()


def restore(workdir: Path, state: TrainState) -> tuple[TrainState, list[EpochMetrics], float, Progress | None] | None:
    """(state, metrics, first_step_loss, progress: None after a whole epoch) of the latest complete
    checkpoint, shaped like `state`; None when there is none."""
    if not (workdir / CHECKPOINT_DIR).is_dir():  # never checkpointed: no need to load Orbax
        return None
    import orbax.checkpoint as ocp

    with _manager(workdir) as manager:
        step = manager.latest_step()
        if step is None:
            return None
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
        restored = manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
        )
    meta = restored.meta
    progress = meta.get("progress")  # absent in checkpoints written before mid-epoch ones existed
    return (
        restored.state,
        [EpochMetrics(**m) for m in meta["metrics"]],
        meta["first_step_loss"],
        Progress(**{**progress, "totals": tuple(progress["totals"])}) if progress else None,
    )
