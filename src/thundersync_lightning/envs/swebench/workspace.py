"""One SWE-bench episode's workspace: the instance's image in a container sandbox, its /testbed copy, the agent's tools and the graded eval run."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from dataclasses import dataclass, field, replace
from typing import Any

from ...core.errors import ConfigError
from ..code.grading import EvalOutcome
from ..code.patches import BASE_GIT_DIR, capture_command, filter_patch, patch_paths
from ..code.pytest_config import manifest_command, parse_manifest, with_contents
from ..code.task import is_protected_path
from ..sandbox.base import RunGuard, SandboxError, SandboxResult
from ..sandbox.bwrap import chown_tree
from ..sandbox.container import ContainerConfig, ContainerSandbox, copy_from_image
from ..sandbox.fs import BoundedDir, release_workdir, remove_tree, sweep_stale
from ..sandbox.uids import UidLease, UidPool
from .eval_run import (
    EVAL_DIR,
    EvalSecrets,
    eval_command,
    grade_eval_run,
    warn_if_dumpable,
    write_eval_dir,
)

__all__ = ['SWEbenchSettings', 'SWEbenchWorkspace']

log = logging.getLogger(__name__)


_APPLY = "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null git -c core.hooksPath=/dev/null apply --verbose " \
         "--whitespace=nowarn -"
_MAX_SOURCE_BYTES = 4 * 1024 * 1024
_GIT_ENV = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}

@dataclass(frozen=True, slots=True)
class SWEbenchSettings:
    container: ContainerConfig = field(default_factory=ContainerConfig)
    root: str = "/tmp/thundersync-sandboxes"
    eval_timeout_s: float = 1800.0
    max_patch_bytes: int = 4 * 1024 * 1024
    max_log_bytes: int = 16 * 1024 * 1024
    image_override: str | None = None  # run every instance in this image (tests, mirrors)
    disk_bytes: int = 8 * 1024**3  # the workspace's tmpfs (the /testbed copies live there: RAM)
    disk_inodes: int = 2_000_000
    require_disk_budget: bool = False


class SWEbenchWorkspace:
    """One instance's /testbed on the host, acted on and graded in containers of its image."""

    def __init__(self, instance: dict[str, Any], settings: SWEbenchSettings, pool: UidPool) -> None:
        self.instance, self.settings, self.pool = instance, settings, pool
        self.image = settings.image_override or str(instance["image"])
        self._lease: UidLease | None = None
        self._dir: str | None = None
        self._budget: BoundedDir | None = None
        self._sandbox: ContainerSandbox | None = None
        self._base = str(instance.get("base_commit") or "HEAD")
        self._guard = RunGuard()  # shared by every container of this workspace: close() stops them all
        test_patch = str(instance.get("test_patch") or "")
        paths = patch_paths(test_patch) if test_patch.strip() else []
        if paths is None:
            raise ConfigError(f"{instance.get('instance_id')}: git cannot parse the instance's test_patch")
        self._test_paths = frozenset(paths)

    def _fresh_testbed(self, dest: str, uid: int) -> None:
        copy_from_image(self.image, "/testbed", dest, self.settings.container)
        chown_tree(dest, uid)

    def _box(self, workdir: str, cap: int | None = None, base_git: bool = False,
             eval_dir: str | None = None, budget: BoundedDir | None = None) -> ContainerSandbox:
        assert self._lease is not None and self._dir is not None and self._budget is not None
        config = self.settings.container
        if cap is not None:
            config = replace(config, limits=replace(config.limits, max_output_bytes=cap))
        ro = {os.path.join(self._dir, "base.git"): BASE_GIT_DIR} if base_git else {}
        if eval_dir is not None:
            ro[eval_dir] = EVAL_DIR
        return ContainerSandbox(workdir, self.image, self._lease.uid, config, guard=self._guard, ro_volumes=ro,
                                budget=budget or self._budget)

    def _base_git(self, agent: str) -> None:
        """A root-owned bare copy of the base commit, made before the agent acts (shallow when the
        base is the checked-out HEAD, as in SWE-bench images)."""
        dest = os.path.join(self._dir or "", "base.git")
        git = ["git", "-c", "safe.directory=*", "-c", "core.hooksPath=/dev/null"]
        head = subprocess.run([*git, "-C", agent, "rev-parse", "HEAD"], env=_GIT_ENV, capture_output=True,
                              text=True, timeout=120).stdout.strip()
        shallow = self._base in ("HEAD", head)
        args = ["clone", "-q", "--bare", *(["--depth=1", f"file://{agent}"] if shallow else ["--no-hardlinks", agent]),
                dest]
        done = subprocess.run([*git, *args], env=_GIT_ENV, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise SandboxError(f"cannot copy the base commit of {agent}: {done.stderr.strip()[-500:]}")
        subprocess.run(["chmod", "-R", "a+rX,go-w", dest], check=True, timeout=600)
        if shallow:
            self._base = head

    def open(self) -> None:
        if self._sandbox is not None:
            return
        os.makedirs(self.settings.root, mode=0o711, exist_ok=True)
        self._lease = self.pool.acquire()
        try:
            sweep_stale(self.settings.root, f"-u{self._lease.uid}-")  # left by a dead holder of this uid
            self._dir = tempfile.mkdtemp(prefix=f"swe-u{self._lease.uid}-", dir=self.settings.root)
            self._budget = BoundedDir(self._dir, self.settings.disk_bytes, self.settings.disk_inodes, 0o711,
                                      require=self.settings.require_disk_budget)
            if not self._budget.enforced:
                log.warning("SWE-bench workspace disk/inode budget not enforced: %s", self._budget.why_not)
            agent = os.path.join(self._dir, "agent")
            copy_from_image(self.image, "/testbed", agent, self.settings.container)
            self._base_git(agent)
            self._image_shell()  # now: once the agent acts, its budget may be full
            chown_tree(agent, self._lease.uid)
            self._sandbox = self._box(agent)
        except BaseException:
            self.close()
            raise

    def run(self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None) -> SandboxResult:
        if self._sandbox is None:
            raise SandboxError("SWEbenchWorkspace.run before open() or after close()")
        return self._sandbox.run(command, stdin=stdin, timeout_s=timeout_s)

    def diff(self) -> str | None:
        if self._sandbox is None:
            raise SandboxError("SWEbenchWorkspace.diff before open() or after close()")
        box = self._box(self._sandbox.workdir, self.settings.max_patch_bytes, base_git=True)
        result = box.run(capture_command(self._base), timeout_s=120.0)
        return result.text if result.ok else None

    def protects(self, path: str) -> bool:
        """Files the instance's test patch touches, and every test/test-configuration path."""
        return path in self._test_paths or is_protected_path(path)

    def evaluate(self, patch: str) -> EvalOutcome:
        if self._lease is None or self._dir is None:
            raise SandboxError("SWEbenchWorkspace.evaluate before open() or after close()")
        from swebench.harness.constants import APPLY_PATCH_FAIL
        from swebench.harness.utils import make_test_spec

        patch = filter_patch(patch, self.protects)
        if not patch.strip():
            return EvalOutcome(False, "empty patch (after dropping changes to tests, or unparseable)")
        spec = make_test_spec(self.instance)
        # Beside the workspace (same uid marker: swept with it), on a disk budget of its own: a
        # workspace the agent filled is graded like any other.
        evalroot = tempfile.mkdtemp(prefix=f"swe-u{self._lease.uid}-eval-", dir=self.settings.root)
        try:
            budget = BoundedDir(evalroot, self.settings.disk_bytes, self.settings.disk_inodes, 0o711,
                                require=self.settings.require_disk_budget)
        except BaseException:
            remove_tree(evalroot)
            raise
        evaldir = os.path.join(evalroot, "testbed")
        try:
            self._fresh_testbed(evaldir, self._lease.uid)
            declared = self._declared_sources(evaldir, spec)  # before anything runs in the copy
            box = self._box(evaldir, self.settings.max_log_bytes, budget=budget)
            config = self._config_manifest(box, evaldir)  # the original tree's, before the agent's patch
            applied = box.run(_APPLY, stdin=patch.encode(), timeout_s=120.0)
            if not applied.ok:
                return EvalOutcome(False, "patch did not apply", log=f"{APPLY_PATCH_FAIL}\n{applied.text}")
            scripts = os.path.join(evalroot, "eval")  # root-owned, bound read-only: no secret inside
            write_eval_dir(scripts, spec.eval_script, spec.log_parser, self._image_shell())
            warn_if_dumpable()
            secrets = EvalSecrets.new()
            result = self._box(evaldir, self.settings.max_log_bytes, eval_dir=scripts, budget=budget).run(
                eval_command(), stdin=secrets.stdin(), timeout_s=self.settings.eval_timeout_s)
            return grade_eval_run(spec, result, secrets, patch, declared, config)
        finally:
            budget.remove()

    def _image_shell(self) -> str:
        """A host copy of the image's shell binary (``ContainerConfig.shell``), made once per
        workspace: the eval run's execute-only shell (see :mod:`.eval_run`)."""
        assert self._dir is not None
        dest = os.path.join(self._dir, "image-shell")
        if not os.path.isfile(dest):
            src = self.settings.container.shell
            for _ in range(8):  # follow the image's links (e.g. /bin/sh -> dash) inside the image
                copy_from_image(self.image, src, dest, self.settings.container)
                if not os.path.islink(dest):
                    break
                target = os.readlink(dest)
                os.unlink(dest)
                src = os.path.normpath(os.path.join(os.path.dirname(src), target))
            else:
                raise SandboxError(f"{self.image}: {self.settings.container.shell} is a chain of links")
            os.chmod(dest, 0o700)
        return dest

    def _declared_sources(self, testbed: str, spec: Any) -> dict[str, str]:
        """The graded tests' original source (path -> text): the image's files, fresh from the image
        and not yet touched by any container, with the instance's ``test_patch`` applied by the
        host's git in a scratch directory. What may mark a graded test xfail or skip (see
        :mod:`.code.outcomes`); files that cannot be read are left out (their tests must pass)."""
        paths = set(self._test_paths)
        paths |= {t.split("::", 1)[0] for t in [*spec.FAIL_TO_PASS, *spec.PASS_TO_PASS] if "::" in t}
        return {rel: data.decode("utf-8", "replace") for rel, data in self._patched_files(testbed, paths).items()
                if data is not None}

    def _config_manifest(self, box: ContainerSandbox, testbed: str) -> dict[str, str]:
        """The manifest of the pytest configuration the eval run must find before its tests: the
        fresh tree's (computed in a container of the image, as the eval shell does), with the
        configuration files the instance's test patch touches as that patch leaves them."""
        listed = box.run(manifest_command(), timeout_s=120.0)
        if not listed.ok:
            raise SandboxError(f"cannot list the pytest configuration of {self.image}: {listed.text[-300:]}")
        return with_contents(parse_manifest(listed.text), self._patched_files(testbed, set(self._test_paths)))

    def _patched_files(self, testbed: str, paths: set[str]) -> dict[str, bytes | None]:
        """``paths`` of the fresh ``testbed`` with the instance's ``test_patch`` applied by the host's
        git in a scratch directory (None: absent, or not a regular file)."""
        with tempfile.TemporaryDirectory(prefix="tsl-declared-") as scratch:
            for rel in sorted(paths):
                src = os.path.join(testbed, rel)
                if rel.startswith("/") or ".." in rel.split("/") or os.path.islink(src) or not os.path.isfile(src):
                    continue
                os.makedirs(os.path.dirname(os.path.join(scratch, rel)), exist_ok=True)
                with open(src, "rb") as f, open(os.path.join(scratch, rel), "wb") as out:
                    out.write(f.read(_MAX_SOURCE_BYTES))
            test_patch = str(self.instance.get("test_patch") or "")
            if test_patch.strip():
                subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], cwd=scratch, input=test_patch.encode(),
                               env=_GIT_ENV, capture_output=True, timeout=120)
            out: dict[str, bytes | None] = {}
            for rel in paths:
                try:
                    with open(os.path.join(scratch, rel), "rb") as f:
                        out[rel] = f.read(_MAX_SOURCE_BYTES)
                except OSError:
                    out[rel] = None
            return out

    def close(self) -> None:
        """Kill whatever still runs (a verdict past its timeout included), then free dirs and uid.
        Never raises; the uid lease is always released."""
        try:
            if not self._guard.cancel():
                log.warning("a container run of %s did not end", self.instance.get("instance_id"))
        except Exception as e:  # noqa: BLE001 - clean-up never raises
            log.warning("cancelling container runs failed: %s", e)
        finally:
            self._sandbox = None
            budget, path, lease = self._budget, self._dir, self._lease
            self._budget = self._dir = self._lease = None
            release_workdir(budget, path, lease)
