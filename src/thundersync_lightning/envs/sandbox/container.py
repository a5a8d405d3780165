"""Container backend (podman or docker): every command is its own short-lived container.

State lives in a host directory bound at /testbed (on a sandbox host reached by ``url``, a bounded
volume of its podman service: :mod:`.volumes`); everything else is the image, read-only. Each
container runs with ``--network none --read-only --cap-drop all --security-opt no-new-privileges``,
an unprivileged ``--user``, ``--pull=never`` (a missing image is an error, never a download),
podman's ``--http-proxy=false`` (no host proxy variables leak in), cgroup limits on pids, memory
(``--memory-swap`` equal to ``--memory``: no swap) and CPU (``--cpus``), a small ``--shm-size``,
``--log-driver none`` and a bounded tmpfs /tmp. The engine's default seccomp profile (an allow
list that denies keyctl, add_key, bpf, perf_event_open, mount, ... to unprivileged containers)
stays in force. Cleanup is
guaranteed four ways: ``--rm``; a server-side deadline (podman ``--timeout``; for docker the
command runs under ``timeout -s KILL`` as pid 1, so the container ends with it); a forced
``rm -f`` of the named container whenever the client returns, was killed, or timed out; and, for a
learner killed before it could do that (SIGKILL, the OOM killer), its reaper (:mod:`.reaper`),
which removes the learner's containers within seconds of its death. Every container is labelled
with its owner (``tsl.host``, ``tsl.owner``) and named after it, so leftovers of dead owners are
found and removed when a reaper starts.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from ...core.errors import ConfigError
from .base import RunGuard, SandboxError, SandboxLimits, SandboxResult, check_command, run_bounded
from .fs import BoundedDir, check_budget
from .hosts import URL_SCHEMES, host_fault, probe
from .reaper import ContainerReaper, container_name, owner_labels, reaper_for

if TYPE_CHECKING:
    from .volumes import BoundedVolume

__all__ = [
    "ContainerConfig",
    "ContainerSandbox",
    "find_engine",
    "image_exists",
    "copy_from_image",
    "locked_down_args",
    "global_args",
]

WORKDIR = "/testbed"
_RUNC = "/usr/sbin/runc"
_REMOTE_RM_S = 30.0  # a host that went away answers no rm: the reaper keeps the name


@dataclass(frozen=True, slots=True)
class ContainerConfig:
    """``engine``: "podman", "docker" or "auto" (podman first). ``runtime``: podman OCI runtime
    ("" = podman's default; "auto" = runc when installed: crun fails where it cannot manage the host's
    cgroups). ``url``: a podman service on a sandbox host (``unix://``, ``ssh://``, ``tcp://``); None takes
    ``CONTAINER_HOST`` from the environment when set (podman itself turns remote then)."""

    engine: str = "auto"
    runtime: str = "auto"
    limits: SandboxLimits = field(default_factory=SandboxLimits)
    memory: str = "2g"
    shell: str = "/bin/bash"
    url: str | None = (
        None  # podman's service on a sandbox host (``podman --url``); None: CONTAINER_HOST, else this host
    )

    def __post_init__(self) -> None:
        if self.url is None and self.engine in ("auto", "podman") and os.environ.get("CONTAINER_HOST"):
            # podman itself turns remote when CONTAINER_HOST is set: follow it (bind mounts of this
            # host's directories would name paths that host does not have)
            object.__setattr__(self, "url", os.environ["CONTAINER_HOST"])
        if self.url is not None and not self.url.startswith(URL_SCHEMES):
            raise ConfigError(
                f"ContainerConfig: url={self.url!r} must start with one of {', '.join(URL_SCHEMES)} "
                "(podman --url: unix:///run/podman/podman.sock, ssh://user@host/run/podman/podman.sock, "
                "tcp://host:port)"
            )
        if self.url is not None and self.engine == "docker":
            raise ConfigError("ContainerConfig: url names a podman service; engine='docker' has none")


@functools.lru_cache(maxsize=8)
def find_engine(engine: str = "auto") -> str | None:
    """Path of a usable container client: the requested one, or podman/docker for "auto" (cached)."""
    names = ("podman", "docker") if engine == "auto" else (engine,)
    for name in names:
        path = shutil.which(name)
        if path is None:
            continue
        if os.path.basename(path) == "docker":
            ok = subprocess.run([path, "info"], capture_output=True, timeout=30).returncode == 0
            if not ok:  # a client without a daemon (as on the CPU machines) is no engine
                continue
        return path
    return None


def _is_podman(engine: str) -> bool:
    return os.path.basename(engine) == "podman"


def global_args(engine: str, config: ContainerConfig) -> list[str]:
    """The engine's global arguments: the service URL (remote) or podman's OCI runtime."""
    if not _is_podman(engine):
        return []
    if config.url is not None:  # the service's own runtime applies (the remote client has no --runtime)
        return ["--url", config.url]
    runtime = config.runtime
    if runtime == "auto":
        runtime = _RUNC if os.path.exists(_RUNC) else ""
    return ["--runtime", runtime] if runtime else []


def image_exists(image: str, engine: str | None = None) -> bool:
    engine = engine or find_engine()
    if engine is None:
        return False
    cmd = [engine, "image", "exists", image] if _is_podman(engine) else [engine, "image", "inspect", image]
    return subprocess.run(cmd, capture_output=True, timeout=60).returncode == 0


def copy_from_image(image: str, src: str, dest: str, config: ContainerConfig | None = None) -> None:
    """Copy ``src`` (a directory in ``image``) to the host directory ``dest`` (must not exist)."""
    config = config or ContainerConfig()
    engine = find_engine(config.engine)
    if engine is None:
        raise SandboxError("no container engine (podman or a running docker) found")
    g = global_args(engine, config)
    reaper = reaper_for(engine, g)
    name = container_name("cp")
    reaper.started(name)
    try:
        created = subprocess.run(
            [engine, *g, "create", "--pull=never", *owner_labels(), "--name", name, image, "true"],
            capture_output=True,
            text=True,
        )
        if created.returncode != 0:
            raise SandboxError(
                f"cannot create a container of image {image!r} (it must be present locally: images "
                f"are never pulled): {created.stderr.strip()[-500:]}"
            )
        copied = subprocess.run([engine, *g, "cp", f"{name}:{src}", dest], capture_output=True, text=True)
        if copied.returncode != 0:
            raise SandboxError(f"cannot copy {src} out of image {image!r}: {copied.stderr.strip()[-500:]}")
    finally:
        subprocess.run([engine, *g, "rm", "-f", name], capture_output=True)
        reaper.finished(name)


def locked_down_args(
    engine: str,
    config: ContainerConfig,
    uid: int,
    name: str,
    add_caps: tuple[str, ...] = (),
    detach: bool = False,
) -> list[str]:
    """``run`` arguments every container of ours gets, before its mounts (see the module docstring);
    ``add_caps``: only for set-up containers that copy the image's files before any agent acts."""
    lim = config.limits
    return [
        engine,
        *global_args(engine, config),
        "run",
        "--rm",
        "-d" if detach else "-i",
        "--name",
        name,
        "--pull=never",
        *(["--http-proxy=false"] if _is_podman(engine) else []),
        *owner_labels(),
        "--network",
        "none",
        "--read-only",
        "--cap-drop",
        "all",
        *[a for c in add_caps for a in ("--cap-add", c)],
        "--security-opt",
        "no-new-privileges",
        "--user",
        f"{uid}:{uid}",
        "--log-driver",
        "none",
        "--pids-limit",
        str(lim.nproc),
        "--memory",
        config.memory,
        "--memory-swap",
        config.memory,
        "--cpus",
        f"{lim.cpus:g}",
        "--shm-size",
        str(lim.dev_bytes),
        "--ulimit",
        f"nofile={lim.nofile}:{lim.nofile}",
        "--ulimit",
        f"nproc={lim.nproc}:{lim.nproc}",
        "--ulimit",
        f"fsize={lim.fsize_bytes}:{lim.fsize_bytes}",
        "--tmpfs",
        f"/tmp:rw,size={lim.tmpfs_bytes},mode=1777",
    ]


class ContainerSandbox:
    """Runs each command in a fresh container of ``image`` with ``workdir`` bound at ``mount_at``
    (/testbed; and ``ro_volumes``: source -> read-only path inside). ``workdir`` is a host
    directory inside ``budget`` (its disk and inode budget; without one, a constructor error), or a
    :class:`~.volumes.BoundedVolume` on the engine's host (``config.url``), its own budget.
    A volume's name is a source in ``ro_volumes`` too."""

    def __init__(
        self,
        workdir: str | BoundedVolume,
        image: str,
        uid: int,
        config: ContainerConfig | None = None,
        env: Mapping[str, str] | None = None,
        guard: RunGuard | None = None,
        ro_volumes: Mapping[str, str] | None = None,
        *,
        budget: BoundedDir | None = None,
        mount_at: str = WORKDIR,
        add_caps: tuple[str, ...] = (),
    ) -> None:
        self.config = config or ContainerConfig()
        engine = find_engine(self.config.engine)
        if engine is None:
            raise SandboxError(
                f"ContainerSandbox: no container engine for engine={self.config.engine!r}: install podman "
                "(apt-get install podman runc) or start a docker daemon."
            )
        if self.config.url is not None and not _is_podman(engine):
            raise SandboxError(f"ContainerSandbox: url={self.config.url!r} needs podman, found {engine}")
        self.engine, self.image, self.uid = engine, image, uid
        self.mount_at, self.add_caps = mount_at, tuple(add_caps)
        if not isinstance(workdir, str):  # a BoundedVolume (imports this module)
            self.workdir, self.budget = workdir.name, None
        else:
            if budget is None:
                raise TypeError(
                    "ContainerSandbox: a host workdir needs its disk budget: budget=BoundedDir(...)"
                )
            if not os.path.isdir(workdir):
                raise SandboxError(f"ContainerSandbox: workdir {workdir!r} does not exist")
            self.workdir = os.path.abspath(workdir)
            self.budget = check_budget("ContainerSandbox", budget, [self.workdir])
        self.env = dict(env or {})
        self.ro_volumes = dict(ro_volumes or {})
        self.guard = guard if guard is not None else RunGuard()
        reaper_for(
            engine, global_args(engine, self.config)
        )  # started now: its sweep removes dead owners' containers

    @property
    def reaper(self) -> ContainerReaper:
        """This process's reaper for the engine (a forked child gets its own)."""
        return reaper_for(self.engine, global_args(self.engine, self.config))

    def argv(self, command: str, name: str, timeout_s: float) -> list[str]:
        secs = max(1, int(timeout_s + 0.999))
        argv = [
            *locked_down_args(self.engine, self.config, self.uid, name, self.add_caps),
            "-v",
            f"{self.workdir}:{self.mount_at}:rw",
            "-w",
            self.mount_at,
            *[a for host, inside in self.ro_volumes.items() for a in ("-v", f"{host}:{inside}:ro")],
            "-e",
            "HOME=/tmp",
            "-e",
            "PYTHONDONTWRITEBYTECODE=1",
        ]
        for key, value in self.env.items():
            argv += ["-e", f"{key}={value}"]
        if _is_podman(self.engine):
            argv += ["--timeout", str(secs), self.image, self.config.shell, "-c", command]
        else:
            argv += [self.image, "timeout", "-s", "KILL", str(secs), self.config.shell, "-c", command]
        return argv

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None
    ) -> SandboxResult:
        check_command(command)  # InvalidCommand before anything starts (Popen would raise on the host)
        self.guard.enter()  # raises after close()
        try:
            return self._run(command, stdin, timeout_s)
        finally:
            self.guard.exit()

    def _run(self, command: str, stdin: bytes | None, timeout_s: float | None) -> SandboxResult:
        lim = self.config.limits
        timeout = timeout_s if timeout_s is not None else lim.timeout_s
        name = container_name()
        reaper = self.reaper
        reaper.started(name)  # before the client starts: a learner killed from here on is covered
        start = time.monotonic()
        result: SandboxResult | None = None
        down: str | None = None
        try:
            # The client gets a little longer than the container so the server-side kill wins.
            result = run_bounded(
                self.argv(command, name, timeout),
                timeout_s=timeout + 15.0,
                max_output_bytes=lim.max_output_bytes,
                stdin=stdin if stdin is not None else b"",
                guard=self.guard,
            )
            if (
                result.exit_code not in (None, 0)
                and not result.cancelled
                and time.monotonic() - start >= timeout
            ):
                note = f"\n[timed out after {timeout:g} s]\n".encode()
                result = replace(result, exit_code=None, timed_out=True, output=result.output + note)
            down = self._host_down(result)
        finally:
            # A host that went away answers no rm either: the reaper keeps the name and retries.
            if down is None and self._remove(name):
                reaper.finished(name)  # only once rm returned (if it did not, the reaper keeps the name)
        if down is not None:
            raise host_fault(str(self.config.url), down)
        assert result is not None  # run_bounded returned (else its exception left above)
        return result

    def _host_down(self, result: SandboxResult) -> str | None:
        """On a remote engine, after a client that failed (125) or hung: why the service no longer
        answers (see :mod:`.hosts`), or None; agent code's own ``exit 125`` is its result."""
        url = self.config.url
        if url is None or result.cancelled or not (result.exit_code == 125 or result.timed_out):
            return None
        return probe(self.engine, url)

    def _remove(self, name: str) -> bool:
        """``rm -f`` the container; False when a remote engine did not answer (in time)."""
        args = ["rm", "-f", "-t", "0", name] if _is_podman(self.engine) else ["rm", "-f", name]
        try:
            done = subprocess.run(
                [self.engine, *global_args(self.engine, self.config), *args],
                capture_output=True,
                timeout=_REMOTE_RM_S if self.config.url else 120,
            )
        except subprocess.TimeoutExpired:
            if self.config.url is None:
                raise
            return False
        return self.config.url is None or done.returncode == 0  # a host that went away removed nothing

    def close(self) -> None:
        """Kill commands in flight (their containers removed), wait for them, refuse new ones."""
        self.guard.cancel()
