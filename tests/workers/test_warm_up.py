"""TRAINHUB_WARM_UP (workers/warm_up.py) imports what a first job of the named framework needs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(("framework", "other"), [("pytorch", "jax"), ("jax", "torch")])
def test_a_warm_up_imports_what_an_eager_first_job_needs_and_nothing_more(framework, other):
    """TRAINHUB_WARM_UP's background import: the framework and its trainer, never the other
    framework, and for PyTorch not torch._dynamo (~1.3 s that a first eager job arriving during
    the warm-up would wait for)."""
    code = (
        "import sys\n"
        "from workers import warm_up\n"
        f"warm_up.warm([{framework!r}])\n"
        f"trainer = {'trainers.torch_trainer' if framework == 'pytorch' else 'trainers.jax_trainer'!r}\n"
        "assert trainer in sys.modules, 'the trainer was not imported'\n"
        f"assert {other!r} not in sys.modules, 'the other framework was imported'\n"
        "assert 'torch._dynamo' not in sys.modules, 'dynamo was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
