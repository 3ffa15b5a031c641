"""Shared trainer runs on scikit-learn's digits: each framework trains once per test session."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainers import EpochMetrics, FitResult, JobSpec, fit

# 1437 // 16 = 89 steps an epoch (13 examples left over), run by the JAX trainer as two chunks
# of 45 steps, the last padded with one skipped step: the shared runs exercise the remainder.
DIGITS_RUN = {"dataset": {"name": "digits"}, "batch_size": 16, "epochs": 3, "seed": 0}


def make_digits_spec(framework: str, **overrides) -> JobSpec:
    return JobSpec(framework=framework, **{**DIGITS_RUN, **overrides})


@dataclass
class Run:
    spec: JobSpec
    workdir: Path
    result: FitResult
    reported: list[tuple[int, EpochMetrics]] = field(default_factory=list)


def run_fit(spec: JobSpec, workdir: Path) -> Run:
    reported: list[tuple[int, EpochMetrics]] = []
    result = fit(spec, workdir, lambda epoch, metrics: reported.append((epoch, metrics)))
    return Run(spec, workdir, result, reported)


@pytest.fixture(scope="session")
def digits_runs(tmp_path_factory) -> dict[str, Run]:
    """{"jax": Run, "pytorch": Run}: the same digits spec trained by each framework."""
    return {
        framework: run_fit(make_digits_spec(framework), tmp_path_factory.mktemp(f"digits-{framework}"))
        for framework in ("jax", "pytorch")
    }


@pytest.fixture
def digits_spec():
    """digits_spec(framework, **overrides) -> JobSpec: the shared digits spec, overridden."""
    return make_digits_spec


@pytest.fixture
def train():
    """train(spec, workdir) -> Run: fit, recording every report."""
    return run_fit
