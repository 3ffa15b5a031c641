"""A pids cgroup per user-code job: every process and thread its child starts, daemons included,
counts against one limit (pids.max) and is killed when the job ends.

Why: RLIMIT_NPROC counts a user's processes and is never applied to root, and a grandchild that
calls setsid leaves the child's process group; so a worker that runs its children as root bounds
neither a fork bomb nor what a job leaves behind. A cgroup does both, for any uid.

Where: `<the worker's own cgroup>/trainhub/<job id>-<random>` (inside the worker's cgroup, so the
job stays under the worker's own limits) in the hierarchy that has the pids controller: cgroup
v1's `pids` mount, or a cgroup2 mount whose cgroup.controllers lists pids (a threaded controller:
it may be enabled in a cgroup that holds the worker itself). `hierarchy()` is None where there is
no such writable hierarchy: jobs then run without one.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

GROUP = "trainhub"
KILL_S = 10.0  # how long `destroy` keeps killing before it gives up on a process that will not die


@dataclass(frozen=True)
class Hierarchy:
    """Where jobs' cgroups are made: `path` (<worker's cgroup>/trainhub) of cgroup `version` 1 or 2."""

    path: Path
    version: int


def _own_dir(mount: Path, root: str, version: int) -> Path | None:
    """The worker's own cgroup as a folder under `mount` (whose hierarchy starts at `root`)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        number, controllers, path = line.split(":", 2)
        if (version == 2 and number == "0") or (version == 1 and "pids" in controllers.split(",")):
            inside = os.path.relpath(path, root)
            # A mount that shows another part of the hierarchy (a container's view): use its top.
            return mount if inside.startswith("..") else mount / inside
    return None


def _candidates() -> list[tuple[Path, int]]:
    """(the worker's cgroup, version) in each mounted hierarchy that may have pids, v2 first."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields, _, tail = line.partition(" - ")
        root, mount = fields.split()[3:5]
        fstype, _source, options = tail.split()[:3]
        version = 2 if fstype == "cgroup2" else 1 if fstype == "cgroup" and "pids" in options.split(",") else 0
        if version and (own := _own_dir(Path(mount), root, version)) is not None:
            found.append((own, version))
    return sorted(found, key=lambda c: -c[1])


def _enable_pids(cgroup: Path) -> None:
    """cgroup v2: give `cgroup`'s children the pids controller (OSError where the host refuses)."""
    control = cgroup / "cgroup.subtree_control"
    if "pids" not in control.read_text().split():
        control.write_text("+pids")


def hierarchy() -> Hierarchy | None:
    """The host's writable pids hierarchy, with its `trainhub` folder made (and on v2 the pids
    controller enabled down to it); None where there is none (no mount, read-only, refused)."""
    for own, version in _candidates():
        try:
            if version == 2:
                if "pids" not in (own / "cgroup.controllers").read_text().split():
                    continue
                _enable_pids(own)
            group = own / GROUP
            group.mkdir(exist_ok=True)
            if version == 2:
                _enable_pids(group)
            if os.access(group / "cgroup.procs", os.W_OK):
                return Hierarchy(group, version)
        except OSError as error:
            log.debug("no pids cgroup under %s: %s", own, error)
    return None


@dataclass(frozen=True)
class JobCgroup:
    """One job's pids cgroup: `path`, made with pids.max = `limit` (processes and threads)."""

    path: Path
    version: int
    limit: int

    @classmethod
    def create(cls, job_id: str, limit: int) -> JobCgroup | None:
        """A new cgroup for job `job_id` holding at most `limit` tasks; None where the host has no
        pids hierarchy. Raises OSError where it has one but the cgroup cannot be made."""
        where = hierarchy()
        if where is None:
            return None
        # The worker's pid says whose it is (remove_orphans); a retried job gets a new one.
        path = where.path / f"{job_id}-{os.getpid()}-{secrets.token_hex(4)}"
        path.mkdir()
        try:
            (path / "pids.max").write_text(str(limit))
        except OSError:
            path.rmdir()
            raise
        return cls(path, where.version, limit)

    def join(self) -> None:
        """Move the calling process into it: in the child between fork and exec (as the worker's
        uid, before Landlock), so everything the child starts is born in it."""
        fd = os.open(self.path / "cgroup.procs", os.O_WRONLY)
        try:
            os.write(fd, b"0")  # 0: the writer itself, in v1 and v2 alike
        finally:
            os.close(fd)

    def pids(self) -> list[int]:
        """The processes in it now."""
        return [int(pid) for pid in (self.path / "cgroup.procs").read_text().split()]

    def reached_limit(self) -> bool:
        """Whether a fork or a new thread was refused at its limit (False where it cannot tell)."""
        try:
            events = dict(line.split()[:2] for line in (self.path / "pids.events").read_text().splitlines())
        except OSError:
            return False
        return int(events.get("max", 0)) > 0

    def destroy(self) -> int | None:
        """SIGKILL whatever is in it until it is empty (a process may fork while the others are
        killed), then remove it. Returns its peak number of tasks (None where the kernel does not
        say, or it could not be removed: logged, and left in place)."""
        kill = self.path / "cgroup.kill"  # cgroup v2, Linux 5.14+: the kernel kills them all at once
        deadline = time.monotonic() + KILL_S
        try:
            while pids := self.pids():
                if time.monotonic() > deadline:
                    raise OSError(f"{len(pids)} processes are still there after SIGKILL")
                if kill.exists():
                    kill.write_text("1")
                else:
                    for pid in pids:
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                time.sleep(0.01)
            peak_file = self.path / "pids.peak"
            peak = int(peak_file.read_text()) if peak_file.exists() else None
            self.path.rmdir()
            return peak
        except OSError as error:
            log.warning("cgroup %s was not removed: %s", self.path, error)
            return None


def remove_orphans() -> int:
    """Destroy the job cgroups under this host's hierarchy whose worker process is gone: what a
    worker killed outright (SIGKILL, a crash) left, its job's processes included. Returns how
    many went. A live worker's cgroups stay, whichever deployment it serves."""
    where = hierarchy()
    if where is None:
        return 0
    removed = 0
    for path in where.path.iterdir():
        worker_pid = path.name.split("-")[-2] if path.name.count("-") >= 2 else ""
        if path.is_dir() and worker_pid.isdigit() and not Path(f"/proc/{worker_pid}").exists():
            JobCgroup(path, where.version, 0).destroy()
            removed += 1
    return removed
