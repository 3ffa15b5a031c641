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


def test_a_warm_up_ending_while_a_job_runs_freezes_the_heap_only_after_the_job():
    """gc.freeze() at the warm-up's end would also freeze the running job's objects, never to be
    collected: it waits for the job's end. With no job running it freezes at once."""
    code = (
        "import gc\n"
        "from workers import warm_up\n"
        "with warm_up.running_job():\n"
        "    job_objects = [object() for _ in range(1000)]\n"
        "    warm_up.warm(['jax'])\n"
        "    assert gc.get_freeze_count() == 0, 'frozen while the job ran'\n"
        "assert gc.get_freeze_count() > 0, 'not frozen after the job'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    idle = "import gc\nfrom workers import warm_up\nwarm_up.warm(['jax'])\nassert gc.get_freeze_count() > 0\n"
    subprocess.run([sys.executable, "-c", idle], check=True, cwd=Path(__file__).parents[2])
