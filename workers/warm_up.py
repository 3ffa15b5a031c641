"""Warm a worker up in the background (TRAINHUB_WARM_UP): import the frameworks it names, with
what their first job would import on top (JAX's CPU client; PyTorch's trainer and optimizer),
so that job starts training without waiting for them.

Not torch._dynamo (~1.3 s): no job needs it but one compiling a step the compile cache lacks
(torch_trainer.skip_dynamo_import; a cached step is loaded by torch's C++ loader), and a job
that arrived during the warm-up would wait for all of it (the import lock).

Off by default: a worker then imports only what its jobs need. A job arriving during the warm-up
waits only for the rest of its framework's import (Python's import lock), never for the other's.
Once the imports are done the heap they built is frozen (gc.freeze): the collector no longer
walks those objects, which never die, at every full collection of a job. A warm-up that ends
while a job runs leaves the freeze to that job's end (`running_job`): frozen then, the job's own
objects would never be collected.
"""

from __future__ import annotations

import gc
import logging
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


def start(frameworks: list[str]) -> threading.Thread | None:
    """Import `frameworks` in a daemon thread; the thread, or None when there is none to warm."""
    if not frameworks:
        return None
    thread = threading.Thread(target=warm, args=(frameworks,), name="trainhub-warm-up", daemon=True)
    thread.start()
    return thread


def warm(frameworks: list[str]) -> None:
    for framework in frameworks:
        start = time.perf_counter()
        try:
            _warm(framework)
        except Exception as exc:  # the job that needs it will fail, saying why
            log.warning("warm-up of %s failed: %s: %s", framework, type(exc).__name__, exc)
            continue
        log.info("warmed up %s in %.2f s", framework, time.perf_counter() - start)
    with _jobs_lock:
        if not _jobs_running:
            _freeze_imports()


def _warm(framework: str) -> None:
    if framework == "jax":
        import jax

        import trainers.jax_trainer  # noqa: F401  flax, optax

        jax.devices()  # the backend's client
    else:
        import torch

        from trainers import torch_trainer

        torch_trainer.skip_dynamo_import()
        torch.optim.Adam([torch.zeros(1, requires_grad=True)], fused=True)


_frozen_with: set[str] = set()
_jobs_running = 0
_jobs_lock = threading.Lock()


@contextmanager
def running_job() -> Iterator[None]:
    """Around a job: no freeze while it runs; after it, freeze what an import (the warm-up's, or
    the job's own) built meanwhile."""
    global _jobs_running
    with _jobs_lock:
        _jobs_running += 1
    try:
        yield
    finally:
        with _jobs_lock:
            _jobs_running -= 1
            if not _jobs_running:
                _freeze_imports()


def _freeze_imports() -> None:
    """gc.freeze() once more whenever a framework was imported since the last time (after the
    warm-up, or after the job that imported it): what an import builds lives as long as the process."""
    loaded = {name for name in ("jax", "torch") if name in sys.modules}
    if loaded <= _frozen_with:
        return
    gc.collect()
    gc.freeze()
    _frozen_with.update(loaded)
