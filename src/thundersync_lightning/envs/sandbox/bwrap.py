"""bubblewrap backend: untrusted shell commands with no network and one writable directory.

bubblewrap contains code only when started under an unprivileged host uid (started as root it
keeps root's reach over the host's files). The chain is therefore

    sh (joins a fresh per-command cgroup: memory incl. tmpfs, pids, cpu; see :mod:`.cgroups`)
      -> prlimit (nproc/as/fsize/nofile/core) -> setpriv (uid U, no groups, no capabilities)
      -> bwrap --unshare-all (net, pid, ipc, uts, cgroup, user) --disable-userns --die-with-parent
         read-only /usr, private /proc, a small private /dev (tmpfs of ``dev_bytes`` with only
         null/zero/full/random/urandom/tty bound in), a bounded /tmp, the workdir at /testbed,
         root remounted ro, a fresh session keyring (bwrap joins a new one), and a seccomp
         deny list (:mod:`.seccomp`) installed right before the command runs.

The pid namespace ties every process the command starts (setsid daemons included) to bwrap: when
the caller kills bwrap (timeout, output cap, or normal end) the kernel kills the whole namespace.
Each concurrent sandbox needs its own uid (``RLIMIT_NPROC`` counts per uid): see :mod:`.uids`.
What the host cannot enforce (no writable cgroup) is named once in a warning, or raises when
``BwrapConfig.require_kernel_limits`` is set.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field

from .base import (
    RunGuard,
    SandboxError,
    SandboxLimits,
    SandboxResult,
    check_command,
    run_bounded,
    wait_readable,
)
from .cgroups import CgroupSupport, CommandCgroup, probe
from .fs import BoundedDir, check_budget
from .seccomp import build_filter, filter_fd

__all__ = [
    "BwrapConfig",
    "BwrapSandbox",
    "bwrap_available",
    "chown_tree",
    "drop_privileges",
    "join_cgroups",
    "system_mounts",
]

WORKDIR = "/testbed"

log = logging.getLogger(__name__)

# Joins the command's cgroups (as root, before anything else runs), then becomes the command.
_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 125; shift; done; shift; exec "$@"'
_DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
_warned: set[str] = set()
_warn_lock = threading.Lock()


@dataclass(frozen=True, slots=True)
class BwrapConfig:
    """How sandboxes are built. ``ro_binds`` are extra host paths bound read-only at the same path
    (e.g. a venv made from /usr/bin/python3 somewhere world-readable). ``cgroups`` and ``seccomp``
    switch those layers (on by default; off only to measure what they add);
    ``require_kernel_limits`` turns "this host cannot enforce X" from a warning into an error."""

    limits: SandboxLimits = field(default_factory=SandboxLimits)
    ro_binds: tuple[str, ...] = ()
    path: str = "/usr/local/bin:/usr/bin:/bin"
    bwrap: str = "bwrap"
    cgroups: bool = True
    seccomp: bool = True
    require_kernel_limits: bool = False


def bwrap_available(bwrap: str = "bwrap") -> bool:
    """True when bubblewrap, setpriv and prlimit are installed and we can switch uids (root)."""
    return all(shutil.which(t) for t in (bwrap, "setpriv", "prlimit")) and os.geteuid() == 0


def join_cgroups(procs_files: tuple[str, ...] | list[str]) -> list[str]:
    """An argv prefix that puts the command in the cgroups of ``procs_files`` (written as root,
    before anything of the command runs) and then executes it; empty when there are none."""
    return ["/bin/sh", "-c", _JOIN, "tsl-join", *procs_files, "--"] if procs_files else []


def drop_privileges(uid: int, nproc: int, memory_bytes: int, fsize_bytes: int, nofile: int) -> list[str]:
    """An argv prefix that sets the rlimits (processes per uid, address space, file size, open
    files, no core dumps), then becomes ``uid`` with no groups and no capabilities, and runs the
    rest (bwrap must start unprivileged: see the module docstring)."""
    u = str(uid)
    return [
        "prlimit",
        f"--nproc={nproc}",
        f"--as={memory_bytes}",
        f"--fsize={fsize_bytes}",
        f"--nofile={nofile}",
        "--core=0",
        "--",
        "setpriv",
        f"--reuid={u}",
        f"--regid={u}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]


def system_mounts(dev_bytes: int, ro_binds: tuple[str, ...] = ()) -> list[str]:
    """bwrap arguments for what every sandbox sees of the host: read-only /usr (with the /bin, /sbin,
    /lib, /lib64 links), the few /etc files programs read, ``ro_binds`` at their own paths, a
    private /proc and a small private /dev (a tmpfs of ``dev_bytes``, only harmless devices)."""
    argv = [
        "--ro-bind",
        "/usr",
        "/usr",
        "--symlink",
        "usr/bin",
        "/bin",
        "--symlink",
        "usr/sbin",
        "/sbin",
        "--symlink",
        "usr/lib",
        "/lib",
        "--symlink",
        "usr/lib64",
        "/lib64",
    ]
    for path in (
        "/etc/alternatives",
        "/etc/ld.so.cache",
        "/etc/ld.so.conf",
        "/etc/ld.so.conf.d",
        "/etc/localtime",
        "/etc/ssl",
        "/etc/python3",
        "/etc/python3.11",
    ):
        if os.path.exists(path):
            argv += ["--ro-bind", path, path]
    for path in ro_binds:
        argv += ["--ro-bind", path, path]
    argv += ["--proc", "/proc", "--size", str(dev_bytes), "--tmpfs", "/dev"]
    for dev in _DEVICES:
        argv += ["--dev-bind", f"/dev/{dev}", f"/dev/{dev}"]
    argv += [
        "--symlink",
        "/proc/self/fd",
        "/dev/fd",
        "--symlink",
        "/proc/self/fd/0",
        "/dev/stdin",
        "--symlink",
        "/proc/self/fd/1",
        "/dev/stdout",
        "--symlink",
        "/proc/self/fd/2",
        "/dev/stderr",
        "--dir",
        "/dev/shm",
    ]
    return argv


def chown_tree(path: str, uid: int) -> None:
    """Give ``path`` and everything below it to ``uid`` (no symlinks followed, no recursion)."""
    os.chown(path, uid, uid, follow_symlinks=False)
    stack = [path]
    while stack:
        with os.scandir(stack.pop()) as it:
            for entry in it:
                os.chown(entry.path, uid, uid, follow_symlinks=False)
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)


class BwrapSandbox:
    """Runs commands as ``uid`` in bubblewrap with ``workdir`` (host path) mounted at /testbed.

    ``budget`` is the disk and inode budget every writable host path lives in: ``workdir`` and
    the host side of each of ``binds`` (further host directories, owned by ``uid``, bound
    writable) must lie inside ``budget.path`` (a sandbox without one is a constructor error: its
    writes would go to the host's disk unbounded). ``ro_binds`` maps host paths to read-only paths
    inside. The workdir must be owned by ``uid`` (see :func:`chown_tree`) and reachable (o+x) by it.
    Sandboxes sharing a ``guard`` are closed together (``close`` cancels every run in flight).
    """

    def __init__(
        self,
        workdir: str,
        uid: int,
        config: BwrapConfig | None = None,
        *,
        budget: BoundedDir,
        binds: Mapping[str, str] | None = None,
        guard: RunGuard | None = None,
        ro_binds: Mapping[str, str] | None = None,
    ) -> None:
        if uid < 1000:
            raise SandboxError(f"BwrapSandbox(uid={uid}): refusing a system uid; use a UidPool lease")
        if not os.path.isdir(workdir):
            raise SandboxError(f"BwrapSandbox: workdir {workdir!r} does not exist")
        self.workdir = os.path.abspath(workdir)
        self.uid = uid
        self.config = config or BwrapConfig()
        self.binds = dict(binds or {})
        self.budget = check_budget(
            "BwrapSandbox", budget, [self.workdir, *self.binds], require=self.config.require_kernel_limits
        )
        self.ro_binds = dict(ro_binds or {})
        self.guard = guard if guard is not None else RunGuard()
        self.cgroup_support = self._cgroup_support()
        self._seccomp = build_filter() if self.config.seccomp else None

    def _cgroup_support(self) -> CgroupSupport | None:
        if not self.config.cgroups:
            return None
        support = probe()
        if support.missing:
            missing = ", ".join(support.missing)
            msg = (
                f"sandbox cgroup limits not enforced for: {missing} ({support.describe_missing()}); "
                "falling back to per-process rlimits (RLIMIT_AS per process, "
                "RLIMIT_NPROC per uid, no CPU cap)"
            )
            if self.config.require_kernel_limits:
                raise SandboxError(msg)
            with _warn_lock:
                if msg not in _warned:
                    _warned.add(msg)
                    log.warning(msg)
        return support if support.parents else None

    def argv(
        self,
        command: str,
        env: Mapping[str, str] | None = None,
        info_fd: int | None = None,
        seccomp_fd: int | None = None,
        cgroup_procs: tuple[str, ...] = (),
    ) -> list[str]:
        lim = self.config.limits
        argv = join_cgroups(cgroup_procs) + drop_privileges(
            self.uid, lim.nproc, lim.memory_bytes, lim.fsize_bytes, lim.nofile
        )
        argv += [
            self.config.bwrap,
            "--unshare-all",
            "--unshare-user",
            "--disable-userns",
            "--die-with-parent",
            "--new-session",
            "--hostname",
            "sandbox",
            *(["--info-fd", str(info_fd)] if info_fd is not None else []),
            *system_mounts(lim.dev_bytes, self.config.ro_binds),
            "--size",
            str(lim.tmpfs_bytes),
            "--tmpfs",
            "/tmp",
            "--clearenv",
        ]
        base_env = {
            "PATH": self.config.path,
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
            "PYTHONDONTWRITEBYTECODE": "1",
            "TERM": "dumb",
        }
        base_env.update(env or {})
        for key, value in base_env.items():
            argv += ["--setenv", key, value]
        argv += ["--bind", self.workdir, WORKDIR]
        for host, inside in self.binds.items():
            argv += ["--bind", host, inside]
        for host, inside in self.ro_binds.items():
            argv += ["--ro-bind", host, inside]
        if seccomp_fd is not None:
            argv += ["--seccomp", str(seccomp_fd)]
        argv += ["--chdir", WORKDIR, "--remount-ro", "/", "--", "/bin/bash", "-c", command]
        return argv

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> SandboxResult:
        check_command(command)  # InvalidCommand before anything starts (Popen would raise on the host)
        self.guard.enter()  # raises after close()
        try:
            return self._run(command, stdin, timeout_s, env)
        finally:
            self.guard.exit()

    def _run(
        self, command: str, stdin: bytes | None, timeout_s: float | None, env: Mapping[str, str] | None
    ) -> SandboxResult:
        lim = self.config.limits
        # bwrap reports the host pid of the namespace's init on --info-fd. The namespace is empty
        # only once that init has exited (the kernel kills and reaps everything inside first), so
        # we wait for it: when run() returns, nothing the command started is alive.
        read_end, write_end = os.pipe()
        init_pidfd: list[int] = []
        open_ends = [write_end]
        seccomp_fd = filter_fd(self._seccomp) if self._seccomp is not None else None
        cgroup = None
        if self.cgroup_support is not None:
            cgroup = CommandCgroup(self.cgroup_support, lim.memory_bytes, lim.nproc, lim.cpus)

        def on_start() -> None:
            os.close(open_ends.pop())
            data = b""
            while b"}" not in data:
                chunk = os.read(read_end, 4096)
                if not chunk:
                    break
                data += chunk
            try:
                init_pidfd.append(os.pidfd_open(int(json.loads(data)["child-pid"])))
            except (ValueError, KeyError, OSError):
                pass  # bwrap failed before starting, or the init is already gone

        try:
            return run_bounded(
                self.argv(
                    command,
                    env,
                    info_fd=write_end,
                    seccomp_fd=seccomp_fd,
                    cgroup_procs=tuple(cgroup.procs_files) if cgroup is not None else (),
                ),
                timeout_s=timeout_s if timeout_s is not None else lim.timeout_s,
                max_output_bytes=lim.max_output_bytes,
                stdin=stdin,
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
                cwd="/",
                pass_fds=(write_end,) if seccomp_fd is None else (write_end, seccomp_fd),
                on_start=on_start,
                guard=self.guard,
            )
        finally:
            for fd in init_pidfd:
                wait_readable([fd], 60.0)
                os.close(fd)
            os.close(read_end)
            for fd in open_ends:  # only if Popen failed before on_start ran
                os.close(fd)
            if seccomp_fd is not None:
                os.close(seccomp_fd)
            if cgroup is not None:
                cgroup.remove()

    def close(self) -> None:
        """Kill commands in flight (their namespaces included), wait for them, refuse new ones."""
        self.guard.cancel()
