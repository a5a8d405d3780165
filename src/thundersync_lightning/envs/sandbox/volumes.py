"""Workspace trees on a sandbox host: bounded tmpfs volumes of its podman service.

A remote podman service cannot bind the learner's directories, so a workspace's tree lives where
its containers run: a named volume of the local driver, a tmpfs (``o=nr_blocks=B,nr_inodes=N,
uid=U,gid=U``; podman 4.3 refuses ``size=`` as a quota option, so the size is given in 4 KiB
pages) with the workspace's disk and inode budget, enforced by the sandbox host's kernel as
:class:`~.fs.BoundedDir` is locally. Podman mounts a volume while a container uses it and drops a
tmpfs with its last user, so each volume has a holder: a locked-down container of the image
that sleeps with the volume bound read-only, alive until :meth:`BoundedVolume.remove`.

Set-up (:func:`setup_box`) copies the image's files in and writes the grading files, as root
with ``CHOWN``/``DAC_OVERRIDE``/``FOWNER`` only, before any agent command ran in the tree (the
local path's ``podman cp`` and ``chown`` as root); everything else runs as the workspace's uid.

Clean-up: the holder and volume are labelled with their owner (the learner process) like every
container of ours, so a learner's reaper removes them when it dies and the start-up sweep removes
a dead owner's (:mod:`.reaper`). Removal never raises.
"""

from __future__ import annotations

import io
import logging
import subprocess
import tarfile
from collections.abc import Iterable, Mapping

from .base import SandboxError
from .container import ContainerConfig, ContainerSandbox, find_engine, global_args, locked_down_args
from .hosts import host_fault, probe
from .reaper import container_name, owner_labels, reaper_for

__all__ = ["BoundedVolume", "setup_box", "pack_files", "unpack_files"]

log = logging.getLogger(__name__)

PAGE = 4096
SETUP_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER")
HOLD_S = 6 * 3600  # a holder's server-side deadline: a learner host lost for good frees the RAM then


class BoundedVolume:
    """A ``disk_bytes`` / ``disk_inodes`` tmpfs volume on ``config``'s engine host, root directory
    owned by ``uid`` with ``mode``, kept mounted by a holder container of ``image``."""

    def __init__(
        self,
        config: ContainerConfig,
        image: str,
        disk_bytes: int,
        disk_inodes: int,
        uid: int,
        mode: int = 0o755,
    ) -> None:
        engine = find_engine(config.engine)
        if engine is None:
            raise SandboxError(f"BoundedVolume: no container engine for engine={config.engine!r}")
        self.config, self.engine, self.image = config, engine, image
        self.name = container_name("vol")
        self._holder = container_name("hold")
        self._g = global_args(engine, config)
        self.reaper = reaper_for(engine, self._g)
        pages = max(1, -(-disk_bytes // PAGE))
        opts = f"nr_blocks={pages},nr_inodes={disk_inodes},uid={uid},gid={uid},mode={mode:o}"
        self._created = False
        self.reaper.started(self._holder)
        try:
            self._call(
                [
                    engine,
                    *self._g,
                    "volume",
                    "create",
                    *owner_labels(),
                    "--opt",
                    "type=tmpfs",
                    "--opt",
                    "device=tmpfs",
                    "--opt",
                    f"o={opts}",
                    self.name,
                ],
                what="create the workspace volume",
            )
            self._created = True
            self._call(
                [
                    *locked_down_args(engine, config, 65534, self._holder, detach=True),
                    "-v",
                    f"{self.name}:/tsl-hold:ro",
                    "--timeout",
                    str(HOLD_S),
                    image,
                    "sleep",
                    "infinity",
                ],
                what="start the volume's holder",
            )
        except BaseException:
            self.remove()
            raise

    def _call(self, argv: list[str], what: str) -> None:
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            done = None
        if done is not None and done.returncode == 0:
            return
        if self.config.url is not None and (why := probe(self.engine, self.config.url)) is not None:
            raise host_fault(self.config.url, why)
        err = "no answer in 120 s" if done is None else done.stderr.strip()[-500:]
        raise SandboxError(f"cannot {what} (image {self.image!r}; images are never pulled): {err}")

    def remove(self) -> None:
        """Remove the holder, then the volume (its RAM with it). Never raises."""
        rm_s = 30.0 if self.config.url else 120.0
        for args in (
            ["rm", "-f", "-t", "0", self._holder],
            ["volume", "rm", "-f", self.name] if self._created else [],
        ):
            if not args:
                continue
            try:
                done = subprocess.run(
                    [self.engine, *self._g, *args],
                    capture_output=True,
                    text=True,
                    timeout=rm_s,
                    stdin=subprocess.DEVNULL,
                )
                why = None if done.returncode == 0 else done.stderr.strip()[-300:]
            except (OSError, subprocess.SubprocessError) as e:
                why = str(e)
            if why is not None:  # the reaper keeps the holder's name: it retries when this process ends
                log.warning("removing %s failed: %s", args[-1], why)
                return
        self._created = False
        self.reaper.finished(self._holder)


def setup_box(
    config: ContainerConfig,
    image: str,
    tree: BoundedVolume,
    mount_at: str = "/tsl-dst",
    ro_volumes: Mapping[str, str] | None = None,
) -> ContainerSandbox:
    """A set-up container for ``tree`` (bound at ``mount_at``): root with :data:`SETUP_CAPS`, the
    image's own /testbed visible. Only for trees no agent command has touched yet."""
    return ContainerSandbox(
        tree, image, 0, config, ro_volumes=ro_volumes, mount_at=mount_at, add_caps=SETUP_CAPS
    )


def pack_files(files: Iterable[tuple[str, bytes, int]]) -> bytes:
    """A tar of ``(name, data, mode)`` files, owned by root (for ``tar -x`` in a set-up container)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        for name, data, mode in files:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.uid, info.gid = len(data), mode, 0, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def unpack_files(data: bytes, wanted: Iterable[str], max_bytes: int) -> dict[str, bytes | None]:
    """Regular files of a tar stream (``wanted`` names; None: absent or not a regular file), each
    at most ``max_bytes``. A truncated stream yields what it holds."""
    out: dict[str, bytes | None] = {name: None for name in wanted}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            for info in tar:
                name = info.name[2:] if info.name.startswith("./") else info.name
                if name in out and info.isreg():
                    f = tar.extractfile(info)
                    out[name] = f.read(max_bytes) if f is not None else None
    except (tarfile.TarError, EOFError, OSError):
        pass
    return out
