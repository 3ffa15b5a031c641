"""Child processes that never outlive the bench.

Every process the bench starts (a loop, the API, the worker, the load generator) gets
`die_with_parent` as its preexec_fn: Linux sends it SIGTERM when the process that started it
dies, however that one dies (Ctrl-C, SIGKILL from a test's timeout). Without it, a killed bench
would leave a worker consuming whatever queue it was given.
"""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1

# Looked up here, in the parent: between fork and exec the child should only make the call.
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # not Linux
    _prctl = None


def die_with_parent() -> None:
    """preexec_fn: ask the kernel for SIGTERM when the parent dies (a no-op off Linux)."""
    if _prctl is not None:
        _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
