"""One SWE-bench episode's workspace: the instance's image in a container sandbox, its /testbed copy, the
agent's tools and the graded eval run."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

from ...core.errors import ConfigError
from ..repo.grading import EvalOutcome
from ..repo.patches import BASE_GIT_DIR, capture_command, filter_patch, patch_paths
from ..repo.pytest_config import is_protected_path, manifest_command, parse_manifest, with_contents
from ..sandbox.base import RunGuard, SandboxError, SandboxResult
from ..sandbox.container import ContainerConfig, ContainerSandbox, find_engine
from ..sandbox.fs import BoundedDir, release_workdir
from ..sandbox.hosts import ContainerHost, HostLease, host_pool
from ..sandbox.uids import UidLease, UidPool
from .eval_run import EVAL_DIR, EvalSecrets, eval_command, grade_eval_run, warn_if_dumpable
from .trees import MAX_SOURCE_BYTES, HostTrees, Tree, Trees, VolumeTrees

__all__ = ["SWEbenchSettings", "SWEbenchWorkspace"]

log = logging.getLogger(__name__)


_APPLY = (
    "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null git -c core.hooksPath=/dev/null apply --verbose "
    "--whitespace=nowarn -"
)
_GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
}


#: The default limit of one grading run (``SWEbenchTasks``'s too).
EVAL_TIMEOUT_S = 1800.0


@dataclass(frozen=True, slots=True)
class SWEbenchSettings:
    """``hosts``: sandbox hosts (podman services, :mod:`..sandbox.hosts`); empty: this host's engine
    (or ``container.url``'s alone). ``host_wait_s``: how long a workspace waits for a free slot."""

    container: ContainerConfig = field(default_factory=ContainerConfig)
    root: str = "/tmp/thundersync-sandboxes"
    eval_timeout_s: float = EVAL_TIMEOUT_S
    max_patch_bytes: int = 4 * 1024 * 1024
    max_log_bytes: int = 16 * 1024 * 1024
    image_override: str | None = None  # run every instance in this image (tests, mirrors)
    disk_bytes: int = 8 * 1024**3  # the workspace's tmpfs (the /testbed copies live there: RAM)
    disk_inodes: int = 2_000_000
    require_disk_budget: bool = False
    hosts: tuple[ContainerHost, ...] = ()
    host_wait_s: float = 600.0


class SWEbenchWorkspace:
    """One instance's /testbed, acted on and graded in containers of its image: on this host, or on
    a sandbox host leased from ``settings.hosts`` (see :mod:`.trees`)."""

    def __init__(self, instance: dict[str, Any], settings: SWEbenchSettings, pool: UidPool) -> None:
        self.instance, self.settings, self.pool = instance, settings, pool
        self.image = settings.image_override or str(instance["image"])
        self.config = settings.container
        self._lease: UidLease | None = None
        self._host: HostLease | None = None
        self._trees: Trees | None = None
        self._sandbox: ContainerSandbox | None = None
        self._base = str(instance.get("base_commit") or "HEAD")
        self._guard = RunGuard()  # shared by every container of this workspace: close() stops them all
        test_patch = str(instance.get("test_patch") or "")
        paths = patch_paths(test_patch) if test_patch.strip() else []
        if paths is None:
            raise ConfigError(f"{instance.get('instance_id')}: git cannot parse the instance's test_patch")
        self._test_paths = frozenset(paths)

    @property
    def host(self) -> str | None:
        """The sandbox host's URL (None: this host's engine)."""
        return self.config.url

    def _box(
        self,
        workdir: Any,
        cap: int | None = None,
        base_git: bool = False,
        eval_source: str | None = None,
        budget: BoundedDir | None = None,
    ) -> ContainerSandbox:
        assert self._lease is not None and self._trees is not None
        config = self.config
        if cap is not None:
            config = replace(config, limits=replace(config.limits, max_output_bytes=cap))
        ro = {self._trees.base_source(): BASE_GIT_DIR} if base_git else {}
        if eval_source is not None:
            ro[eval_source] = EVAL_DIR
        return ContainerSandbox(
            workdir,
            self.image,
            self._lease.uid,
            config,
            guard=self._guard,
            ro_volumes=ro,
            budget=budget if budget is not None else self._trees.agent_budget,
        )

    def open(self) -> None:
        if self._sandbox is not None:
            return
        s = self.settings
        # Locals as well as fields: close() may run meanwhile (the loop gave up on this reset) and
        # take only what was assigned by then; open() frees the rest itself.
        lease = self._lease = self.pool.acquire()
        host: HostLease | None = None
        trees: Trees | None = None
        try:
            if s.hosts:
                engine = find_engine(s.container.engine) or "podman"
                host = self._host = host_pool(engine, s.hosts).acquire(s.host_wait_s)
                self.config = replace(s.container, url=host.host.url)
            if self.config.url is not None:
                trees = VolumeTrees(self.image, self.config, lease.uid, s.disk_bytes, s.disk_inodes)
            else:
                trees = HostTrees(
                    self.image,
                    self.config,
                    lease.uid,
                    s.root,
                    s.disk_bytes,
                    s.disk_inodes,
                    s.require_disk_budget,
                )
            self._trees = trees
            self._base = trees.open(self._base)
            if self._guard.cancelled:
                raise SandboxError("SWEbenchWorkspace closed while it was opening")
            self._sandbox = self._box(trees.agent)
        except BaseException:
            self.close()  # then what a close() that ran meanwhile did not see; each frees once
            if trees is not None:
                trees.close()
            if host is not None:
                host.release()
            lease.release()
            raise

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None
    ) -> SandboxResult:
        if self._sandbox is None:
            raise SandboxError("SWEbenchWorkspace.run before open() or after close()")
        return self._sandbox.run(command, stdin=stdin, timeout_s=timeout_s)

    def diff(self) -> str | None:
        if self._sandbox is None:
            raise SandboxError("SWEbenchWorkspace.diff before open() or after close()")
        assert self._trees is not None
        box = self._box(self._trees.agent, self.settings.max_patch_bytes, base_git=True)
        result = box.run(capture_command(self._base), timeout_s=120.0)
        return result.text if result.ok else None

    def protects(self, path: str) -> bool:
        """Files the instance's test patch touches, and every test/test-configuration path (a
        module named like one of the test patch's files included: it would shadow it)."""
        return path in self._test_paths or is_protected_path(path, tuple(self._test_paths))

    def evaluate(self, patch: str) -> EvalOutcome:
        if self._lease is None or self._trees is None:
            raise SandboxError("SWEbenchWorkspace.evaluate before open() or after close()")
        from swebench.harness.constants import APPLY_PATCH_FAIL
        from swebench.harness.utils import make_test_spec

        patch = filter_patch(patch, self.protects)
        if not patch.strip():
            return EvalOutcome(False, "empty patch (after dropping changes to tests, or unparseable)")
        spec = make_test_spec(self.instance)
        trees = self._trees
        tree = (
            trees.fresh()
        )  # a disk budget of its own: a workspace the agent filled is graded like any other
        try:
            patched = self._patched_files(tree, self._graded_paths(spec))  # before anything runs in the copy
            declared = _texts(patched)
            box = self._box(tree.workdir, self.settings.max_log_bytes, budget=tree.budget)
            config = self._config_manifest(box, patched)  # the original tree's, before the agent's patch
            applied = box.run(_APPLY, stdin=patch.encode(), timeout_s=120.0)
            if not applied.ok:
                return EvalOutcome(False, "patch did not apply", log=f"{APPLY_PATCH_FAIL}\n{applied.text}")
            scripts = trees.write_eval(tree, spec.eval_script, spec.log_parser)
            warn_if_dumpable()
            secrets = EvalSecrets.new()
            result = self._box(
                tree.workdir, self.settings.max_log_bytes, eval_source=scripts, budget=tree.budget
            ).run(eval_command(), stdin=secrets.stdin(), timeout_s=self.settings.eval_timeout_s)
            return grade_eval_run(spec, result, secrets, patch, declared, config)
        finally:
            trees.remove(tree)

    def _graded_paths(self, spec: Any) -> set[str]:
        """The files whose original source decides a grade: the instance's test-patch paths and the
        graded tests' files."""
        paths = set(self._test_paths)
        return paths | {t.split("::", 1)[0] for t in [*spec.FAIL_TO_PASS, *spec.PASS_TO_PASS] if "::" in t}

    def _declared_sources(self, testbed: Tree, spec: Any) -> dict[str, str]:
        """The graded tests' original source (path -> text): the image's files, fresh from the image
        and not yet touched by any container, with the instance's ``test_patch`` applied by the
        host's git in a scratch directory. What may mark a graded test xfail or skip (see
        :mod:`.code.outcomes`); files that cannot be read are left out (their tests must pass)."""
        return _texts(self._patched_files(testbed, self._graded_paths(spec)))

    def _config_manifest(self, box: ContainerSandbox, patched: dict[str, bytes | None]) -> dict[str, str]:
        """The manifest of the pytest configuration the eval run must find before its tests: the
        fresh tree's (computed in a container of the image, as the eval shell does), with the
        configuration files the instance's test patch touches as that patch leaves them
        (``patched``: :meth:`_patched_files` of the graded paths, which hold the test patch's)."""
        listed = box.run(manifest_command(), timeout_s=120.0)
        if not listed.ok:
            raise SandboxError(f"cannot list the pytest configuration of {self.image}: {listed.text[-300:]}")
        return with_contents(parse_manifest(listed.text), {p: patched.get(p) for p in self._test_paths})

    def _patched_files(self, testbed: Tree, paths: set[str]) -> dict[str, bytes | None]:
        """``paths`` of the fresh ``testbed`` with the instance's ``test_patch`` applied by the host's
        git in a scratch directory (None: absent, or not a regular file)."""
        assert self._trees is not None
        original = self._trees.read(testbed, paths)
        with tempfile.TemporaryDirectory(prefix="tsl-declared-") as scratch:
            for rel, data in sorted(original.items()):
                if data is None:
                    continue
                os.makedirs(os.path.dirname(os.path.join(scratch, rel)), exist_ok=True)
                with open(os.path.join(scratch, rel), "wb") as out:
                    out.write(data)
            test_patch = str(self.instance.get("test_patch") or "")
            if test_patch.strip():
                subprocess.run(
                    ["git", "apply", "--whitespace=nowarn", "-"],
                    cwd=scratch,
                    input=test_patch.encode(),
                    env=_GIT_ENV,
                    capture_output=True,
                    timeout=120,
                )
            out: dict[str, bytes | None] = {}
            for rel in paths:
                try:
                    with open(os.path.join(scratch, rel), "rb") as f:
                        out[rel] = f.read(MAX_SOURCE_BYTES)
                except OSError:
                    out[rel] = None
            return out

    def close(self) -> None:
        """Kill whatever still runs (a verdict past its timeout included), then free the trees, the
        host slot and the uid. Never raises; the leases are always released."""
        try:
            if not self._guard.cancel():
                log.warning("a container run of %s did not end", self.instance.get("instance_id"))
        except Exception as e:  # noqa: BLE001 - clean-up never raises
            log.warning("cancelling container runs failed: %s", e)
        finally:
            self._sandbox = None
            trees, host, lease = self._trees, self._host, self._lease
            self._trees = self._host = self._lease = None
            try:
                if trees is not None:
                    trees.close()
            except Exception as e:  # noqa: BLE001 - clean-up never raises
                log.warning("removing the trees of %s failed: %s", self.instance.get("instance_id"), e)
            finally:
                if host is not None:
                    host.release()
                release_workdir(None, None, lease)


def _texts(files: dict[str, bytes | None]) -> dict[str, str]:
    return {rel: data.decode("utf-8", "replace") for rel, data in files.items() if data is not None}
