"""The walls around a user-code job's child process, set up between fork and exec.

- its environment is built from nothing: none of the worker's settings or secrets;
- a pids cgroup of its own where the host has a writable pids hierarchy (workers/cgroup.py): it
  and all it starts count against one limit of processes and threads, whatever their uid, and all
  are killed when the job ends (daemons that left its process group too);
- resource limits (`resource.setrlimit`): address space, size of any file it writes, processes
  of its user (a fork bomb, but never root's), CPU seconds (from max_runtime_s), no core dumps;
- as root: a network namespace of its own (no interface but a down loopback) and the uid/gid
  of `nobody`, so it owns nothing of the worker's;
- Landlock (Linux 5.13+, no privilege needed): it may read only the Python installation, the
  system libraries, the trainers package and this job's data, write only its own working
  directory, connect to and bind no TCP port (ABI 4+), and signal no process outside it (ABI 6+).

`available()` says which of these the host gives; the worker logs it and the README states it.
"""

from __future__ import annotations

import ctypes
import os
import resource
import struct
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from workers import cgroup

NOBODY = 65534
CLONE_NEWNET = 0x40000000
PR_SET_NO_NEW_PRIVS = 38
_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # x86_64 and arm64 alike
_RULE_PATH_BENEATH = 1
# Landlock's filesystem rights (linux/landlock.h), bit by bit.
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_READ = _EXECUTE | _READ_FILE | _READ_DIR
_FILE_RIGHTS = _EXECUTE | _WRITE_FILE | _READ_FILE | (1 << 14) | (1 << 15)  # + truncate, ioctl_dev
_ALL_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1, 5: (1 << 16) - 1}
_NET_BIND, _NET_CONNECT = 1, 2
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1, 2

_libc = ctypes.CDLL(None, use_errno=True)

# The files of /etc a child may read: the dynamic loader's cache, the time zone, the user and
# group names (getpass.getuser, which Inductor's cache folder asks), how to look them up, the
# hosts file, the OS release and the MIME types (Python's mimetypes).
ETC_FILES = ("ld.so.cache", "localtime", "passwd", "group", "nsswitch.conf", "hosts", "os-release", "mime.types")


@dataclass(frozen=True)
class Limits:
    """The child's resource limits: bytes of address space, bytes of the largest file it may
    write, processes (threads included) of its pids cgroup and of its user, CPU seconds (None:
    unlimited)."""

    memory_bytes: int
    file_bytes: int
    processes: int = 64
    cpu_s: int | None = None


def landlock_abi() -> int:
    """The host's Landlock ABI version; 0 when the kernel has none."""
    version = _libc.syscall(_SYS_CREATE_RULESET, None, 0, 1)  # LANDLOCK_CREATE_RULESET_VERSION
    return max(version, 0)


def _nobody_can_run_python() -> bool:
    """Whether the uid nobody can reach this Python (a Python under /root, mode 700, it cannot)."""
    for path in (Path(sys.executable).resolve(), Path(sys.prefix).resolve()):
        if not all(os.stat(parent).st_mode & 0o001 for parent in path.parents):
            return False
    return True


def available() -> dict[str, bool]:
    """Which walls this host gives a child: {"pids_cgroup", "network_namespace", "own_uid",
    "landlock", "landlock_network", "landlock_signals"}."""
    abi, root = landlock_abi(), os.geteuid() == 0
    return {
        "pids_cgroup": cgroup.hierarchy() is not None,
        "network_namespace": root,
        "own_uid": root and _nobody_can_run_python(),
        "landlock": abi >= 1,
        "landlock_network": abi >= 4,
        "landlock_signals": abi >= 6,
    }


def clean_env(workdir: Path, threads: int, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The child's whole environment: a PATH, a home and temp folder in its workdir, a locale,
    thread counts; nothing of the worker's (no TRAINHUB_*, database, broker, S3 or API keys)."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workdir),
        "TMPDIR": str(workdir / "tmp"),
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": str(threads),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    return {**env, **(extra or {})}


def readable_roots(extra: Iterable[Path] = ()) -> list[Path]:
    """What a child may read: the Python installation (and the virtualenv), the system's
    libraries, the trainers package, and `extra` (this job's data)."""
    import trainers

    roots = [Path(sys.base_prefix), Path(sys.prefix), Path(trainers.__file__).parent]
    roots += [Path(p) for p in ("/usr", "/lib", "/lib64", "/bin", "/sys", "/dev/urandom")]
    # Of /etc only what the loader, the C library and Python read; not all of it: a child left as
    # root (own_uid false) could otherwise read /etc/shadow, SSH host keys and the like.
    roots += [Path("/etc") / name for name in ETC_FILES]
    # The one file of /proc it reads: XLA's CPU kernels (YNNPACK's cpuinfo) fail without it.
    roots.append(Path("/proc/cpuinfo"))
    roots += list(extra)
    return [root for root in dict.fromkeys(r.resolve() for r in roots) if root.exists()]


def preexec(
    workdir: Path, limits: Limits, readable: list[Path], group: cgroup.JobCgroup | None = None
) -> Callable[[], None]:
    """The function Popen runs in the child between fork and exec: it joins `group` (its job's pids
    cgroup, while it still may: before setuid and Landlock), limits, then (as root) its own network
    and the uid of nobody, then Landlock. Anything it cannot do where the host allows it raises,
    and the child never starts (Popen raises SubprocessError)."""
    walls = available()
    abi = landlock_abi()

    def setup() -> None:
        if group is not None:
            group.join()
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.file_bytes, limits.file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if limits.cpu_s is not None:
            resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 5))
        if walls["network_namespace"] and _libc.unshare(CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNET)")
        if walls["own_uid"]:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
        # After setuid: RLIMIT_NPROC counts the processes of the child's (real) user (never root's:
        # the kernel exempts uid 0, so a child left as root is bounded by its pids cgroup only).
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))
        if abi >= 1:
            _restrict(abi, workdir, readable)

    return setup


def _restrict(abi: int, workdir: Path, readable: list[Path]) -> None:
    handled_fs = _ALL_FS_BY_ABI.get(abi, (1 << 16) - 1)
    handled_net = _NET_BIND | _NET_CONNECT if abi >= 4 else 0
    scoped = _SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL if abi >= 6 else 0
    attr = struct.pack("QQQ", handled_fs, handled_net, scoped)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _libc.syscall(_SYS_CREATE_RULESET, ctypes.c_char_p(attr[:size]), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset")
    try:
        for path in readable:
            _allow(ruleset, path, _READ & handled_fs)
        # /dev/null read and written (subprocess.DEVNULL, a shell's `> /dev/null`): Inductor's C++
        # builds for a user module's "compile" throw their output there.
        _allow(ruleset, Path(os.devnull), _FILE_RIGHTS & ~_EXECUTE & handled_fs)
        _allow(ruleset, workdir, handled_fs)
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
        if _libc.syscall(_SYS_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self")
    finally:
        os.close(ruleset)


def _allow(ruleset: int, path: Path, rights: int) -> None:
    fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    try:
        if not path.is_dir():
            rights &= _FILE_RIGHTS  # a file takes only the rights that apply to files
        rule = struct.pack("=Qi", rights, fd)  # struct landlock_path_beneath_attr is packed
        if _libc.syscall(_SYS_ADD_RULE, ruleset, _RULE_PATH_BENEATH, ctypes.c_char_p(rule), 0) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
    finally:
        os.close(fd)
