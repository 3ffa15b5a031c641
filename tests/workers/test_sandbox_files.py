"""What a user-code child may touch on the host's files (workers/sandbox.py's Landlock rules):
its own folder, reading the Python installation and the data, and /dev/null for writing (a
subprocess's output thrown away, as Inductor's C++ builds and shell redirects do); never
the rest. So a user module's "compile" builds inside the sandbox. Skipped where the kernel has
no Landlock."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from workers import sandbox

pytestmark = pytest.mark.skipif(sandbox.landlock_abi() < 1, reason="this kernel has no Landlock")

CHILD = """
import pathlib, subprocess, sys
subprocess.run(["true"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
subprocess.run(["sh", "-c", "echo discarded > /dev/null"], check=True)
with open("/dev/null", "w") as sink:
    sink.write("discarded")
assert open("/dev/null").read() == ""
pathlib.Path("mine.txt").write_text("kept")
for path in (pathlib.Path(sys.argv[1]) / "outside.txt", pathlib.Path("/tmp") / "outside.txt"):
    try:
        path.write_text("escaped")
    except PermissionError:
        continue
    raise SystemExit(f"wrote {path}")
"""


def run_sandboxed(workdir: Path, code: str, *args: str) -> subprocess.CompletedProcess:
    # the service's defaults (TRAINHUB_USER_CODE_FILE_BYTES 1 GiB): Inductor's precompiled header
    # is ~150 MB, so a "compile" job needs a file limit above that
    limits = sandbox.Limits(memory_bytes=8 * 1024**3, file_bytes=1024**3)
    return subprocess.run(
        [sys.executable, "-c", code, *args], cwd=workdir, env=sandbox.clean_env(workdir, 1),
        preexec_fn=sandbox.preexec(workdir, limits, sandbox.readable_roots()), capture_output=True, text=True,
        timeout=60,
    )


def test_a_child_writes_its_folder_and_dev_null_and_nothing_else(tmp_path):
    workdir, outside = tmp_path / "job", tmp_path / "other"
    workdir.mkdir()
    outside.mkdir()
    (workdir / "tmp").mkdir()
    done = run_sandboxed(workdir, CHILD, str(outside))
    assert done.returncode == 0, done.stderr[-2000:]
    assert (workdir / "mine.txt").read_text() == "kept"
    assert not (outside / "outside.txt").exists()


def test_torch_compile_builds_and_runs_inside_the_sandbox(tmp_path):
    (tmp_path / "tmp").mkdir()
    code = "import torch\nstep = torch.compile(lambda x: (x * 2).relu().sum())\nprint(float(step(torch.ones(8, 8))))\n"
    done = run_sandboxed(tmp_path, code)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "128.0"
