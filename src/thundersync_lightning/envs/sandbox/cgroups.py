"""Per-command cgroups: memory (tmpfs and page cache included), process count and CPU bounded by
the kernel for everything one sandboxed command starts, together.

``RLIMIT_AS`` and ``RLIMIT_NPROC`` are per process / per uid: N processes may use N times the
memory limit. A cgroup counts them all, and it counts tmpfs pages (``/tmp``, ``/dev/shm``, a tmpfs
workdir) to the group that wrote them. Two layouts exist:

* cgroup v2 (one unified hierarchy): ``memory.max`` + ``memory.swap.max``, ``pids.max``,
  ``cpu.max``. The controllers must be enabled in our own group's ``cgroup.subtree_control``.
* cgroup v1 (one hierarchy per controller, as on the CPU machines): ``memory.limit_in_bytes`` +
  ``memory.memsw.limit_in_bytes`` (when swap accounting exists), ``pids.max``,
  ``cpu.cfs_quota_us``.

Invariants: groups are created only NESTED under the groups this process already belongs to (read
from ``/proc/self/cgroup``), never elsewhere, so the sandbox stays inside its parent's accounting;
each command gets a fresh group, joined by the launcher before it drops privileges, and removed
after the command's processes are dead. :func:`probe` reports which limits the host lets us
enforce; what it cannot is named in a warning (or an error when required).
"""

from __future__ import annotations

import logging
import os
import signal
import uuid
from dataclasses import dataclass, field

from .base import SandboxError

__all__ = ["CgroupSupport", "CommandCgroup", "probe"]

log = logging.getLogger(__name__)

_LIMITS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True, slots=True)
class CgroupSupport:
    """Where per-command groups can be made: ``parents`` maps a controller to the directory under
    which ours are created (v2: the same directory for all). ``missing`` names what cannot be
    enforced, with the reason."""

    version: int  # 1, 2, or 0 when none is usable
    parents: dict[str, str] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    memsw: bool = False  # v1: swap accounted as well (memory.memsw.limit_in_bytes exists)

    @property
    def enforced(self) -> tuple[str, ...]:
        return tuple(c for c in _LIMITS if c in self.parents)

    def describe_missing(self) -> str:
        return "; ".join(f"{c}: {why}" for c, why in self.missing.items())


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """(mount root, mount point, fstype, super options) of every cgroup mount of this process."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            parts, fs = pre.split(), post.split()
            if len(fs) >= 3 and fs[0] in ("cgroup", "cgroup2"):
                out.append((parts[3], parts[4], fs[0], set(fs[2].split(","))))
    return out


def _own_groups() -> dict[str, str]:
    """controller (or "" for v2) -> our group path, from /proc/self/cgroup."""
    out: dict[str, str] = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                out[c] = path
    return out


def _writable_dir(path: str) -> bool:
    return os.path.isdir(path) and os.access(path, os.W_OK | os.X_OK)


def _join(mount_root: str, mount_point: str, group: str) -> str | None:
    """The host directory of ``group`` under a mount whose root is ``mount_root``."""
    if group != mount_root and not group.startswith(mount_root.rstrip("/") + "/"):
        return None  # our group is not visible through this mount
    rel = group[len(mount_root) :].lstrip("/")
    return os.path.join(mount_point, rel) if rel else mount_point


def _probe_v2(mounts, own) -> CgroupSupport | None:
    for root, point, fstype, _ in mounts:
        if fstype != "cgroup2" or "" not in own:
            continue
        parent = _join(root, point, own[""])
        if parent is None or not os.path.isdir(parent):
            continue
        try:
            with open(os.path.join(parent, "cgroup.controllers")) as f:
                available = set(f.read().split())
        except OSError:
            continue
        if not available & set(_LIMITS):
            return None  # an empty unified hierarchy (controllers live in v1 mounts)
        missing = {c: "controller not available in our cgroup" for c in _LIMITS if c not in available}
        wanted = [c for c in _LIMITS if c in available]
        try:
            with open(os.path.join(parent, "cgroup.subtree_control")) as f:
                enabled = set(f.read().split())
            todo = [c for c in wanted if c not in enabled]
            if todo:
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as f:
                    f.write(" ".join("+" + c for c in todo))
        except OSError as e:
            why = (
                f"cannot enable it in {parent}/cgroup.subtree_control ({e.strerror}): run the learner in a "
                "delegated cgroup with no processes of its own in that group (e.g. systemd-run --scope "
                "-p Delegate=yes, then move the learner into a leaf)"
            )
            return CgroupSupport(0, {}, {c: why for c in _LIMITS})
        if not _writable_dir(parent):
            return CgroupSupport(0, {}, {c: f"{parent} is not writable" for c in _LIMITS})
        return CgroupSupport(2, {c: parent for c in wanted}, missing)
    return None


def _probe_v1(mounts, own) -> CgroupSupport:
    parents: dict[str, str] = {}
    missing: dict[str, str] = {}
    for c in _LIMITS:
        point = None
        for root, mpoint, fstype, opts in mounts:
            if fstype == "cgroup" and c in opts and c in own:
                point = _join(root, mpoint, own[c])
                break
        if point is None:
            missing[c] = "no cgroup v1 hierarchy with this controller contains our group"
        elif not _writable_dir(point):
            missing[c] = f"{point} is not writable by us"
        else:
            parents[c] = point
    memsw = "memory" in parents and os.path.exists(
        os.path.join(parents["memory"], "memory.memsw.limit_in_bytes")
    )
    return CgroupSupport(1 if parents else 0, parents, missing, memsw)


_probed: CgroupSupport | None = None


def probe(refresh: bool = False) -> CgroupSupport:
    """What this host lets us enforce (cached per process)."""
    global _probed
    if _probed is None or refresh:
        try:
            mounts, own = _mounts(), _own_groups()
            _probed = _probe_v2(mounts, own) or _probe_v1(mounts, own)
        except OSError as e:
            _probed = CgroupSupport(0, {}, {c: f"cannot read /proc/self cgroup data: {e}" for c in _LIMITS})
    return _probed


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


class CommandCgroup:
    """The group(s) of one command: created with its limits, joined through :attr:`procs_files`,
    and removed by :meth:`remove` (which kills whatever is still inside first; never raises)."""

    def __init__(self, support: CgroupSupport, memory_bytes: int, pids: int, cpus: float) -> None:
        self.support = support
        self.dirs: list[str] = []
        name = f"tsl-{os.getpid()}-{uuid.uuid4().hex[:12]}"
        try:
            if support.version == 2:
                d = os.path.join(next(iter(support.parents.values())), name)
                os.mkdir(d)
                self.dirs.append(d)
                if "memory" in support.parents:
                    _write(os.path.join(d, "memory.max"), str(memory_bytes))
                    if os.path.exists(os.path.join(d, "memory.swap.max")):
                        _write(os.path.join(d, "memory.swap.max"), "0")
                if "pids" in support.parents:
                    _write(os.path.join(d, "pids.max"), str(pids))
                if "cpu" in support.parents:
                    _write(os.path.join(d, "cpu.max"), f"{int(cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}")
            else:
                for c, parent in support.parents.items():
                    d = os.path.join(parent, name)
                    os.mkdir(d)
                    self.dirs.append(d)
                    if c == "memory":
                        _write(os.path.join(d, "memory.limit_in_bytes"), str(memory_bytes))
                        if support.memsw:
                            _write(os.path.join(d, "memory.memsw.limit_in_bytes"), str(memory_bytes))
                    elif c == "pids":
                        _write(os.path.join(d, "pids.max"), str(pids))
                    elif c == "cpu":
                        _write(os.path.join(d, "cpu.cfs_period_us"), str(_CPU_PERIOD_US))
                        _write(os.path.join(d, "cpu.cfs_quota_us"), str(int(cpus * _CPU_PERIOD_US)))
        except OSError as e:
            self.remove()
            raise SandboxError(f"cannot set up the command's cgroup under {support.parents}: {e}") from e

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(d, "cgroup.procs") for d in self.dirs]

    def _pids(self) -> set[int]:
        pids: set[int] = set()
        for f in self.procs_files:
            try:
                with open(f) as fh:
                    pids.update(int(p) for p in fh.read().split())
            except OSError:
                pass
        return pids

    def remove(self) -> None:
        """Kill what is left inside, then remove the group directories. Never raises."""
        for _ in range(100):
            pids = self._pids()
            if not pids:
                break
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            os.sched_yield()
        for d in reversed(self.dirs):
            try:
                os.rmdir(d)
            except FileNotFoundError:
                pass
            except OSError as e:
                log.warning("could not remove sandbox cgroup %s: %s", d, e)
        self.dirs = []
