"""Framework code only: data, models, the JAX trainer and the PyTorch trainer.

Use it as a library::

    from trainers import fit, JobSpec
    result = fit(JobSpec(framework="jax", dataset={"name": "digits"}), workdir, report)

`fit` dispatches lazily, so importing this package imports neither jax nor torch.
"""

from trainers.base import (
    EpochMetrics,
    FitResult,
    HardwareMismatch,
    NanLoss,
    Report,
    RunOptions,
    ShouldStop,
    StopTraining,
    fit,
)
from trainers.data import DataNotFound
from trainers.spec import JobSpec

__all__ = [
    "DataNotFound",
    "EpochMetrics",
    "FitResult",
    "HardwareMismatch",
    "NanLoss",
    "JobSpec",
    "Report",
    "RunOptions",
    "ShouldStop",
    "StopTraining",
    "fit",
]
