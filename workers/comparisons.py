"""After a job of a comparison succeeds: once both sides have, record the parity check."""

from __future__ import annotations

import logging

from safetensors.numpy import load
from sqlalchemy import or_, select, update

from app import storage
from app.config import get_settings
from app.db import session_scope
from app.models import Comparison, Job
from app.status import JobStatus
from trainers import parity
from trainers.data import load_dataset
from trainers.presets import layers_of
from trainers.spec import ComparisonSpec, model_dropout
from workers import dataset_cache

log = logging.getLogger(__name__)


def settle(job_id: str) -> None:
    """Compute and store the parity of the comparison `job_id` belongs to, if both jobs succeeded.

    Both workers may get here at once; each writes the same result, so that is harmless."""
    with session_scope() as session:
        comparison = session.scalars(
            select(Comparison).where(or_(Comparison.jax_job_id == job_id, Comparison.pytorch_job_id == job_id))
        ).first()
        if comparison is None or comparison.parity is not None:
            return
        sides = (comparison.jax_job, comparison.pytorch_job)
        if any(job.status != JobStatus.SUCCEEDED for job in sides):
            return
        spec = ComparisonSpec.model_validate(comparison.spec)
        runs = [_run(job) for job in sides]
        comparison_id = comparison.id
    if spec.model.user_code:  # its modules run only in their jobs' sandboxes: no predictions here
        shared = (spec.model.init or "shared") == "shared"
        task = "regression" if "test_rmse" in runs[1]["result"] else "classification"
        result = parity.check_user_code(runs[0], runs[1], shared_init=shared, task=task)
    else:
        result = _check_built_in(spec, runs)
    with session_scope() as session:
        session.execute(update(Comparison).where(Comparison.id == comparison_id).values(parity=result))
        session.commit()
    log.info("comparison %s parity: %s", comparison_id, result["message"])


def _check_built_in(spec: ComparisonSpec, runs: list[dict]) -> dict:
    """parity.check of the two runs, on the test set both trained for."""
    dataset_file, _ = dataset_cache.fetch_for(spec)
    data = load_dataset(spec.dataset, get_settings().data_dir, dataset_file)
    return parity.check(
        runs[0],
        runs[1],
        data.x_test,
        model_dropout(spec.model),
        y_test=data.y_test,
        task=data.task,
        input_shape=data.input_shape,
        layers=layers_of(spec.model, data.outputs),
    )


def _run(job: Job) -> dict:
    # The other job may have run on another host: read its weights from the store, not a path.
    locations = {a.name: a.path for a in job.artifacts}
    return {
        "first_step_loss": (job.result or {}).get("first_step_loss", float("nan")),
        "train_losses": [m.train_loss for m in job.metrics],
        "weights": load(storage.read_bytes(locations["weights.safetensors"])),
        "result": job.result or {},
    }
