"""Where a user's tool or reward function runs: a worker process confined as agent code is.

A worker starts once per scope (one episode's tools; the reward pool) and then answers calls
over its pipes, so confinement costs a start-up per scope and a pipe round trip per call. With
``WorkerLimits(sandbox="bwrap")`` (the default) its chain is

    sh (joins the worker's own cgroups: memory, pids, cpu; see ..sandbox.cgroups)
      -> unshare --mount --propagation private   (a mount namespace of the chain's own, still root)
         -> sh: a tmpfs on the stage directory, and each host path the worker needs bound under it
      -> prlimit (nproc, as, fsize, nofile, core) -> setpriv (a uid of its own, no groups, no caps)
      -> bwrap --unshare-all (net, pid, ipc, uts, cgroup, user) --disable-userns --die-with-parent
         system mounts (read-only /usr, private /proc and /dev, see ..sandbox.bwrap.system_mounts),
         each staged path bound read-only at its own path, a bounded /tmp, root remounted ro,
         an empty environment, the seccomp deny list (..sandbox.seccomp)
      -> python -u worker_main.py

Why the stage: bwrap runs as the unprivileged uid and resolves every bind source as that uid, so an
interpreter under ``/root`` (mode 0700, pyenv's default) or a module under a 0700 temporary
directory could not be bound (``--ro-bind-fd`` resolves the descriptor's path the same way). The
stage binds are made as root, in the chain's private mount namespace: the host's mount table never
changes and the namespace ends with the worker. A staged path shows only itself: a directory the
others cannot read (mode without ``o+rx``) stays unreadable to the worker; it is left out and named
in a warning.

Bound read-only: the interpreter (``sys.prefix``, ``sys.base_prefix`` and the exec prefixes), this
package's worker script, and every directory (or zip) of the caller's ``sys.path`` but a
top-level or kernel one (``/``, ``/tmp``, ``/proc``, ...: it would show the host; named in a
warning). The binds are fixed when a worker starts; a call whose ``sys.path`` holds a directory the
worker lacks gets a new worker. Nothing else of the host is visible; nothing is writable
but the worker's private /tmp.

With ``sandbox="rlimits"``, and as the fallback where bubblewrap cannot run (not installed, or the
engine is not root so it cannot give the worker a uid of its own), the worker is a plain process
under the same rlimits and the same empty environment, with the engine's uid, files and network:
the fallback is named in a warning once per process, or refused (:class:`ConfigError`) with
``require_sandbox=True``.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from ...core.errors import ConfigError, HostFault
from ..sandbox.base import SandboxError, kill_group
from ..sandbox.bwrap import bwrap_available, drop_privileges, join_cgroups, system_mounts
from ..sandbox.cgroups import CommandCgroup, probe
from ..sandbox.seccomp import build_filter, filter_fd
from ..sandbox.uids import UidLease, UidPool

__all__ = ["WorkerLimits", "Worker", "start_worker", "confinement", "caller_paths"]

log = logging.getLogger(__name__)

MAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker_main.py")
_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "TMPDIR": "/tmp",
    "PYTHONDONTWRITEBYTECODE": "1",
}
# Binds each host path ("$1" ...) under a tmpfs on the stage, as root, then runs the rest ("--" ...).
_STAGE = (
    'stage=$1; shift; mount -t tmpfs -o mode=0755,size=65536,nr_inodes=4096 tsl-stage "$stage" || exit 125; '
    'i=0; while [ "$1" != -- ]; do if [ -d "$1" ]; then mkdir "$stage/$i"; else : > "$stage/$i"; fi '
    '&& mount --bind "$1" "$stage/$i" || exit 125; i=$((i + 1)); shift; done; shift; exec "$@"'
)


@dataclass(frozen=True, slots=True)
class WorkerLimits:
    """How the workers of the user's tools and rewards are confined (``DatasetTasks(worker_limits=...)``).

    ``sandbox``: ``"bwrap"`` (a uid of its own, no network, read-only host, empty environment;
    see the module docstring) or ``"rlimits"`` (a plain process with the limits only).
    ``require_sandbox``: a host where bubblewrap cannot run is a ConfigError instead of a warning
    and the rlimits fallback. Limits: ``memory_bytes`` (each process's address space, and the
    worker's whole cgroup where the host has one), ``nproc`` (processes of the worker's uid),
    ``fsize_bytes`` (largest file written), ``nofile`` (open descriptors), ``tmpfs_bytes`` (its
    /tmp), ``cpus`` (CPU time per wall second, cgroup). ``cgroups`` and ``seccomp`` switch those
    layers (on by default; off only to measure what they add). Uids come from ``[uid_base,
    uid_base + uid_count)``, one per live worker (each episode's, each reward worker); no other
    pool of the package hands out that range (workspaces: 3_100_000, ``unit_tests``: 3_500_000).
    """

    sandbox: Literal["bwrap", "rlimits"] = "bwrap"
    require_sandbox: bool = False
    memory_bytes: int = 1024**3
    nproc: int = 64
    fsize_bytes: int = 16 * 1024**2
    nofile: int = 256
    tmpfs_bytes: int = 64 * 1024**2
    cpus: float = 1.0
    cgroups: bool = True
    seccomp: bool = True
    uid_base: int = 3_700_000
    uid_count: int = 512

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)!r} must be > 0"
            for name in ("memory_bytes", "nproc", "fsize_bytes", "nofile", "tmpfs_bytes", "cpus", "uid_count")
            if not getattr(self, name) > 0
        ]
        if self.sandbox not in ("bwrap", "rlimits"):
            problems.append(f"sandbox={self.sandbox!r} must be 'bwrap' or 'rlimits'")
        if self.uid_base < 1000:
            problems.append(f"uid_base={self.uid_base} must be >= 1000 (no system uid)")
        if problems:
            raise ConfigError("invalid WorkerLimits: " + "; ".join(problems))

    @classmethod
    def of(cls, value: WorkerLimits | Mapping[str, Any] | None) -> WorkerLimits:
        """``value`` as limits: a WorkerLimits, a mapping of its fields (YAML), or None (defaults)."""
        if value is None:
            return cls()
        if isinstance(value, WorkerLimits):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"worker_limits must be a mapping of WorkerLimits fields, got {type(value).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ConfigError(f"worker_limits: unknown keys {unknown}; the fields are {sorted(known)}")
        return cls(**dict(value))


def _bwrap_missing() -> str | None:
    """Why this process cannot start confined workers, or None when it can."""
    if not bwrap_available():
        return (
            "bubblewrap, setpriv or prlimit is missing, or the engine is not root (only root can give a "
            "worker a uid of its own)"
        )
    missing = [t for t in ("unshare", "mount") if shutil.which(t) is None]
    return f"{' and '.join(missing)} not found" if missing else None


_warned: set[str] = set()
_warn_lock = threading.Lock()


def _warn_once(message: str) -> None:
    with _warn_lock:
        if message not in _warned:
            _warned.add(message)
            log.warning(message)


def confinement(limits: WorkerLimits) -> Literal["bwrap", "rlimits"]:
    """The mode workers of ``limits`` run in on this host: ``"bwrap"`` where asked and possible;
    else ``"rlimits"``, after a warning (once per process) or, with ``require_sandbox``, a ConfigError."""
    if limits.sandbox == "rlimits":
        return "rlimits"
    why = _bwrap_missing()
    if why is None:
        return "bwrap"
    message = (
        f"the user's tools and rewards cannot be confined: {why}. They run as plain processes with the "
        f"engine's uid ({os.geteuid()}), files and network, under rlimits only (memory, file size, open "
        "files). Fix: install bubblewrap (apt-get install bubblewrap) and run the engine as root, or set "
        "worker_limits: {require_sandbox: true} to refuse to run unconfined"
    )
    if limits.require_sandbox:
        raise ConfigError(message)
    _warn_once(message)
    return "rlimits"


def caller_paths() -> tuple[str, ...]:
    """This process's ``sys.path`` as absolute paths ('' is the working directory), in order."""
    out: list[str] = []
    for p in sys.path:
        if isinstance(p, str):
            path = os.path.abspath(p or ".")
            if path not in out:
                out.append(path)
    return tuple(out)


def _readable(path: str) -> bool:
    """Whether a uid of nobody's may read ``path`` (a directory: list and enter it)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return bool(mode & 0o004) and (not os.path.isdir(path) or bool(mode & 0o001))


def _binds(paths: Iterable[str]) -> tuple[str, ...]:
    """The host paths a confined worker needs bound for ``paths`` (the caller's ``sys.path``):
    the interpreter's prefixes, the worker script's directory and each existing entry, those
    already under /usr or under another bound path left out; unreadable ones named in a warning."""
    wanted = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        os.path.dirname(MAIN),
        *paths,
    ]
    kept: list[str] = []
    for path in sorted({os.path.normpath(p) for p in wanted}, key=lambda p: (p.count("/"), p)):
        if not os.path.exists(path) or any(
            path == k or path.startswith(k.rstrip("/") + "/") for k in ("/usr", *kept)
        ):
            continue
        if path.count("/") < 2 or path.split("/")[1] in ("proc", "sys", "dev"):
            _warn_once(
                f"confined tool and reward workers do not see {path} (on sys.path): a top-level or kernel "
                "directory would show them the host; put your modules in a directory of their own"
            )
            continue
        if not _readable(path):
            _warn_once(
                f"confined tool and reward workers cannot read {path} (mode "
                f"{os.stat(path).st_mode & 0o777:o}; they run as a uid of their own): modules there cannot "
                f"be imported by them. Fix: chmod o+rx {path} (o+r for its files)"
            )
            continue
        kept.append(path)
    return tuple(kept)


def _stage_dir() -> str:
    """An empty root-owned directory to stage binds on (in each worker's own mount namespace)."""
    path = os.path.join("/tmp", "thundersync-worker-stage")
    os.makedirs(path, mode=0o755, exist_ok=True)
    st = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or st.st_uid != 0:
        raise HostFault(f"{path} is not a directory owned by root: remove it (another user may have made it)")
    os.chmod(path, 0o755)
    return path


_uid_pools: dict[tuple[int, int], UidPool] = {}
_uid_lock = threading.Lock()


def _lease(limits: WorkerLimits) -> UidLease:
    with _uid_lock:
        pool = _uid_pools.setdefault(
            (limits.uid_base, limits.uid_count), UidPool(limits.uid_base, limits.uid_count)
        )
    return pool.acquire()


@dataclass
class Worker:
    """A started worker: its process, and what it holds until :meth:`stop` (a uid, cgroups)."""

    proc: subprocess.Popen[bytes]
    paths: frozenset[str]  # the caller's sys.path it was started for (its binds)
    lease: UidLease | None = None
    cgroup: CommandCgroup | None = None

    def kill(self) -> None:
        """Kill the worker and everything it started (the sandbox's pid namespace included) and
        wait for them; its pipes stay open (a call reading them sees their end). Never raises."""
        try:
            kill_group(self.proc)
        except OSError:
            pass

    def stop(self) -> int | None:
        """:meth:`kill`, then close its pipes, reap it, free its uid and cgroups; the worker's exit
        code (None if it would not be reaped). Never raises; only its caller may use the pipes."""
        self.kill()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            code = self.proc.wait(timeout=30.0)
        except subprocess.TimeoutExpired:
            code = None
        if self.cgroup is not None:
            self.cgroup.remove()
        if self.lease is not None and code is not None:  # a uid is reused only once its processes are gone
            self.lease.release()
        return code


def start_worker(limits: WorkerLimits, paths: tuple[str, ...]) -> Worker:
    """A worker process for calls from a caller whose ``sys.path`` is ``paths``; HostFault when
    the host cannot start one."""
    rlimits = [
        "prlimit",
        f"--as={limits.memory_bytes}",
        f"--fsize={limits.fsize_bytes}",
        f"--nofile={limits.nofile}",
        "--core=0",
        "--",
    ]
    python = [sys.executable, "-u", MAIN]
    if confinement(limits) == "rlimits":
        try:
            proc = subprocess.Popen(
                rlimits + python,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=dict(_ENV),
                start_new_session=True,
            )
        except OSError as exc:
            raise HostFault(f"could not start a tool worker: {exc}") from exc
        return Worker(proc, frozenset(paths))
    binds = _binds(paths)
    lease: UidLease | None = None
    cgroup = None
    seccomp_fd = None
    try:
        lease = _lease(limits)
        support = probe() if limits.cgroups else None
        if support is not None and support.missing:
            _warn_once(
                f"tool and reward workers' cgroup limits not enforced for {', '.join(support.missing)} "
                f"({support.describe_missing()}): rlimits only (address space per process, processes per uid)"
            )
        if support is not None and support.parents:
            cgroup = CommandCgroup(support, limits.memory_bytes, limits.nproc, limits.cpus)
        stage = _stage_dir()
        argv = [
            *join_cgroups(cgroup.procs_files if cgroup is not None else ()),
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "/bin/sh",
            "-c",
            _STAGE,
            "tsl-stage",
            stage,
            *binds,
            "--",
            *drop_privileges(lease.uid, limits.nproc, limits.memory_bytes, limits.fsize_bytes, limits.nofile),
            "bwrap",
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "worker",
            *system_mounts(1024**2),
            "--size",
            str(limits.tmpfs_bytes),
            "--tmpfs",
            "/tmp",
            "--clearenv",
        ]
        for i, path in enumerate(binds):  # after /tmp: a module directory under /tmp stays visible
            argv += ["--ro-bind", f"{stage}/{i}", path]
        for key, value in _ENV.items():
            argv += ["--setenv", key, value]
        if limits.seccomp:
            seccomp_fd = filter_fd(build_filter())
            argv += ["--seccomp", str(seccomp_fd)]
        argv += ["--chdir", "/tmp", "--remount-ro", "/", "--", *python]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            cwd="/",
            start_new_session=True,
            pass_fds=() if seccomp_fd is None else (seccomp_fd,),
        )
    except BaseException as exc:
        if cgroup is not None:
            cgroup.remove()
        if lease is not None:
            lease.release()
        if isinstance(exc, (OSError, ValueError, SandboxError)):
            raise HostFault(f"could not start a confined tool worker: {type(exc).__name__}: {exc}") from exc
        raise
    finally:
        if seccomp_fd is not None:
            os.close(seccomp_fd)
    return Worker(proc, frozenset(paths), lease, cgroup)
