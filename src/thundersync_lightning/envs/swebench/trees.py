"""Where a SWE-bench workspace's trees live: host directories (the engine on this host) or bounded
volumes of a sandbox host's podman service (``ContainerConfig.url``, see :mod:`..sandbox.volumes`).

Both give the workspace the same four things, with the same rules:

- the agent's ``/testbed``: the image's, owned by the workspace uid, on the workspace's disk budget;
- a root-owned bare copy of the base commit, made before the agent acts (shallow when the base is
  the checked-out HEAD), bound read-only for the patch capture only;
- per verdict, a fresh ``/testbed`` on a disk budget of its own, whose graded files are read before
  anything runs in it, and a root-owned, read-only directory of eval files with the image's shell
  as an execute-only copy (see :mod:`.eval_run`).
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from ..sandbox.base import SandboxError
from ..sandbox.bwrap import chown_tree
from ..sandbox.container import ContainerConfig, copy_from_image
from ..sandbox.fs import BoundedDir, release_workdir, remove_tree, sweep_stale
from ..sandbox.volumes import BoundedVolume, pack_files, setup_box, unpack_files
from .eval_run import SHELL_NAME, eval_files, write_eval_dir

__all__ = ["Tree", "Trees", "HostTrees", "VolumeTrees", "MAX_SOURCE_BYTES"]

log = logging.getLogger(__name__)

MAX_SOURCE_BYTES = 4 * 1024 * 1024
_GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}
_EVAL_BYTES, _EVAL_INODES = 64 * 1024**2, 1000


@dataclass(slots=True)
class Tree:
    """A fresh ``/testbed`` for one verdict: ``workdir`` and ``budget`` as :class:`ContainerSandbox`
    takes them; ``root``: its host directory (the eval files go beside it), or ``volumes``: the
    sandbox host's volumes it and its eval files occupy."""

    workdir: Any
    budget: BoundedDir | None = None
    root: str | None = None
    volumes: list[BoundedVolume] = field(default_factory=list)


class Trees(Protocol):
    agent: Any  # the agent's /testbed (a host path or a BoundedVolume)
    agent_budget: BoundedDir | None

    def open(self, base: str) -> str: ...  # make the agent's tree and the base copy; the resolved base
    def base_source(self) -> str: ...
    def fresh(self) -> Tree: ...
    def read(self, tree: Tree, paths: set[str]) -> dict[str, bytes | None]: ...
    def write_eval(self, tree: Tree, script: str, log_parser: str) -> str: ...
    def remove(self, tree: Tree) -> None: ...
    def close(self) -> None: ...


def _is_head(base: str, head: str) -> bool:
    return base in ("HEAD", head)


class HostTrees:
    """Trees in a host directory under ``root`` (one tmpfs budget per tree where the host can mount)."""

    def __init__(
        self,
        image: str,
        config: ContainerConfig,
        uid: int,
        root: str,
        disk_bytes: int,
        disk_inodes: int,
        require_budget: bool,
    ) -> None:
        self.image, self.config, self.uid, self.root = image, config, uid, root
        self.disk = (disk_bytes, disk_inodes, require_budget)
        self._dir: str | None = None
        self.agent: Any = None
        self.agent_budget: BoundedDir | None = None

    def _budget(self, path: str) -> BoundedDir:
        size, inodes, require = self.disk
        return BoundedDir(path, size, inodes, 0o711, require=require)

    def open(self, base: str) -> str:
        os.makedirs(self.root, mode=0o711, exist_ok=True)
        sweep_stale(self.root, f"-u{self.uid}-")  # left by a dead holder of this uid
        self._dir = tempfile.mkdtemp(prefix=f"swe-u{self.uid}-", dir=self.root)
        self.agent_budget = self._budget(self._dir)
        if not self.agent_budget.enforced:
            log.warning("SWE-bench workspace disk/inode budget not enforced: %s", self.agent_budget.why_not)
        agent = os.path.join(self._dir, "agent")
        copy_from_image(self.image, "/testbed", agent, self.config)
        base = self._base_git(agent, base)
        self._image_shell()  # now: once the agent acts, its budget may be full
        chown_tree(agent, self.uid)
        self.agent = agent
        return base

    def _base_git(self, agent: str, base: str) -> str:
        dest = os.path.join(self._dir or "", "base.git")
        git = ["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null"]
        head = subprocess.run(
            [*git, "-C", agent, "rev-parse", "HEAD"],
            env=_GIT_ENV,
            capture_output=True,
            text=True,
            timeout=120,
        ).stdout.strip()
        shallow = _is_head(base, head)
        args = [
            "clone",
            "-q",
            "--bare",
            *(["--depth=1", f"file://{agent}"] if shallow else ["--no-hardlinks", agent]),
            dest,
        ]
        done = subprocess.run([*git, *args], env=_GIT_ENV, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SandboxError(f"cannot copy the base commit of {agent}: {done.stderr.strip()[-500:]}")
        subprocess.run(["chmod", "-R", "a+rX,go-w", dest], check=True, timeout=600)
        return head if shallow else base

    def base_source(self) -> str:
        return os.path.join(self._dir or "", "base.git")

    def _image_shell(self) -> str:
        """A host copy of the image's shell binary (``ContainerConfig.shell``), made once per workspace."""
        assert self._dir is not None
        dest = os.path.join(self._dir, "image-shell")
        if not os.path.isfile(dest):
            src = self.config.shell
            for _ in range(8):  # follow the image's links (e.g. /bin/sh -> dash) inside the image
                copy_from_image(self.image, src, dest, self.config)
                if not os.path.islink(dest):
                    break
                target = os.readlink(dest)
                os.unlink(dest)
                src = os.path.normpath(os.path.join(os.path.dirname(src), target))
            else:
                raise SandboxError(f"{self.image}: {self.config.shell} is a chain of links")
            os.chmod(dest, 0o700)
        return dest

    def fresh(self) -> Tree:
        # Beside the workspace (same uid marker: swept with it), on a disk budget of its own.
        evalroot = tempfile.mkdtemp(prefix=f"swe-u{self.uid}-eval-", dir=self.root)
        try:
            budget = self._budget(evalroot)
        except BaseException:
            remove_tree(evalroot)
            raise
        tree = Tree(os.path.join(evalroot, "testbed"), budget, root=evalroot)
        try:
            copy_from_image(self.image, "/testbed", tree.workdir, self.config)
            chown_tree(tree.workdir, self.uid)
        except BaseException:
            budget.remove()
            raise
        return tree

    def read(self, tree: Tree, paths: set[str]) -> dict[str, bytes | None]:
        out: dict[str, bytes | None] = {}
        for rel in paths:
            src = os.path.join(tree.workdir, rel)
            if (
                rel.startswith("/")
                or ".." in rel.split("/")
                or os.path.islink(src)
                or not os.path.isfile(src)
            ):
                out[rel] = None
                continue
            with open(src, "rb") as f:
                out[rel] = f.read(MAX_SOURCE_BYTES)
        return out

    def write_eval(self, tree: Tree, script: str, log_parser: str) -> str:
        scripts = os.path.join(tree.root or "", "eval")  # root-owned, bound read-only: no secret inside
        write_eval_dir(scripts, script, log_parser, self._image_shell())
        return scripts

    def remove(self, tree: Tree) -> None:
        if tree.budget is not None:
            tree.budget.remove()

    def close(self) -> None:
        budget, path = self.agent_budget, self._dir
        self.agent_budget = self._dir = self.agent = None
        release_workdir(budget, path, None)


class VolumeTrees:
    """Trees as bounded volumes of the sandbox host's podman service (``config.url``)."""

    def __init__(
        self, image: str, config: ContainerConfig, uid: int, disk_bytes: int, disk_inodes: int
    ) -> None:
        self.image, self.config, self.uid = image, config, uid
        self.disk = (disk_bytes, disk_inodes)
        self.agent: Any = None
        self.agent_budget: BoundedDir | None = None
        self._base: BoundedVolume | None = None
        self._volumes: list[BoundedVolume] = []

    def _volume(self, uid: int, disk: tuple[int, int] | None = None) -> BoundedVolume:
        size, inodes = disk or self.disk
        volume = BoundedVolume(self.config, self.image, size, inodes, uid)
        self._volumes.append(volume)
        return volume

    def _setup(
        self,
        tree: BoundedVolume,
        command: str,
        what: str,
        stdin: bytes | None = None,
        ro: dict[str, str] | None = None,
        cap: int | None = None,
    ) -> bytes:
        config = self.config if cap is None else self._capped(cap)
        done = setup_box(config, self.image, tree, ro_volumes=ro).run(command, stdin=stdin, timeout_s=1800.0)
        if not done.ok:
            raise SandboxError(f"cannot {what} in a container of {self.image!r}: {done.text[-500:]}")
        return done.output

    def _fill(self, tree: BoundedVolume) -> None:
        self._setup(
            tree,
            f"cp -a /testbed/. /tsl-dst/ && chown -R {self.uid}:{self.uid} /tsl-dst",
            "copy the image's /testbed",
        )

    def open(self, base: str) -> str:
        agent = self._volume(self.uid)
        self._fill(agent)
        self._base = self._volume(0)
        # A global config of our own (HOME is the container's /tmp): upload-pack, run by the clone,
        # reads safe.directory only from there (the tree belongs to the workspace uid, not root).
        script = (
            "printf '[safe]\\n\\tdirectory = *\\n[core]\\n\\thooksPath = /dev/null\\n' > /tmp/.gitconfig && "
            "head=$(git -C /tsl-src rev-parse HEAD) || exit 3; "
            f'if [ {shlex.quote(base)} = HEAD ] || [ {shlex.quote(base)} = "$head" ]; then '
            "git clone -q --bare --depth=1 file:///tsl-src /tsl-dst; else "
            "git clone -q --bare --no-hardlinks /tsl-src /tsl-dst; fi && chmod -R a+rX,go-w /tsl-dst "
            "&& printf 'HEAD=%s\\n' \"$head\""
        )
        out = self._setup(
            self._base,
            f"export HOME=/tmp GIT_CONFIG_NOSYSTEM=1; {script}",
            "copy the base commit",
            ro={agent.name: "/tsl-src"},
        ).decode("utf-8", "replace")
        head = next((line[5:] for line in out.splitlines() if line.startswith("HEAD=")), "")
        self.agent = agent
        return head if _is_head(base, head) else base

    def base_source(self) -> str:
        assert self._base is not None
        return self._base.name

    def fresh(self) -> Tree:
        volume = self._volume(self.uid)
        tree = Tree(volume, volumes=[volume])
        self._fill(volume)
        return tree

    def read(self, tree: Tree, paths: set[str]) -> dict[str, bytes | None]:
        names = sorted(p for p in paths if not (p.startswith("/") or ".." in p.split("/")))
        if not names:
            return {p: None for p in paths}
        listed = "\0".join(names).encode() + b"\0"
        cap = len(names) * (MAX_SOURCE_BYTES + 1024) + 10240
        done = setup_box(self._capped(cap), self.image, tree.workdir).run(
            "tar -c -f - --no-recursion --ignore-failed-read --null -T - 2>/dev/null; exit 0",
            stdin=listed,
            timeout_s=600.0,
        )
        found = unpack_files(done.output, names, MAX_SOURCE_BYTES)
        return {p: found.get(p) for p in paths}

    def _capped(self, cap: int) -> ContainerConfig:
        return replace(self.config, limits=replace(self.config.limits, max_output_bytes=cap))

    def write_eval(self, tree: Tree, script: str, log_parser: str) -> str:
        volume = self._volume(0, (_EVAL_BYTES, _EVAL_INODES))
        files = [(name, text.encode(), 0o644) for name, text in eval_files(script, log_parser)]
        shell = shlex.quote(self.config.shell)
        self._setup(
            volume,
            f"tar -x -f - -C /tsl-dst && cp -L {shell} /tsl-dst/{SHELL_NAME} && "
            f"chmod 0711 /tsl-dst/{SHELL_NAME} && chmod 0755 /tsl-dst",
            "write the eval files",
            stdin=pack_files(files),
        )
        tree.volumes.append(volume)
        return volume.name

    def remove(self, tree: Tree) -> None:
        for volume in tree.volumes:
            volume.remove()
            if volume in self._volumes:
                self._volumes.remove(volume)

    def close(self) -> None:
        volumes, self._volumes = self._volumes, []
        self.agent = self._base = None
        for volume in volumes:
            volume.remove()
