"""Where a local task's agent works and where its patch is graded: bubblewrap sandboxes on the host.

Layout under ``root`` (0711, root-owned): one private directory per workspace with ``agent/`` (the
repository the agent edits, a git repository at the original state, owned by the sandbox uid) and,
for each verdict, a fresh ``eval-*`` copy of the ORIGINAL repository: the agent's filtered patch
is applied there and the tests run there, so nothing the agent left behind (caches, test edits,
background processes) reaches the grading run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field, replace

from ..sandbox.base import RunGuard, SandboxError, SandboxLimits, SandboxResult
from ..sandbox.bwrap import BwrapConfig, BwrapSandbox, bwrap_available, chown_tree
from ..sandbox.uids import UidLease, UidPool
from .grading import EvalOutcome, filter_patch, framed_log, grade_log, pytest_command
from .task import LocalTask

__all__ = ["WorkspaceSettings", "LocalWorkspace", "DIFF_COMMAND", "grading_slots"]

_GIT = "GIT_CONFIG_NOSYSTEM=1 git -c core.hooksPath=/dev/null -c core.fsmonitor=false -c core.quotePath=false"
DIFF_COMMAND = (
    f"{_GIT} add -A . >/dev/null && "
    f"{_GIT} diff --cached --binary --no-ext-diff --no-textconv --no-color --no-renames {{base}}"
)


@dataclass(frozen=True, slots=True)
class WorkspaceSettings:
    """Sandbox settings of local workspaces. ``python`` runs the tests inside the sandbox (it must
    import pytest and be readable by an unprivileged uid: Debian's python3 + python3-pytest, or a
    venv listed in ``bwrap.ro_binds``). ``parallel_tests`` bounds the grading runs of this process
    (0: twice the CPU count; CPU-bound suites saturate the cores well before that)."""

    bwrap: BwrapConfig = field(default_factory=lambda: BwrapConfig(SandboxLimits(timeout_s=20.0)))
    root: str = "/tmp/thundersync-sandboxes"
    python: str = "python3"
    test_timeout_s: float = 120.0
    max_patch_bytes: int = 1024 * 1024
    max_log_bytes: int = 4 * 1024 * 1024
    parallel_tests: int = 0


_slots: dict[int, threading.BoundedSemaphore] = {}
_slots_lock = threading.Lock()


def grading_slots(n: int) -> threading.BoundedSemaphore:
    """The process-wide semaphore of ``n`` grading slots (0: twice the CPU count)."""
    n = n if n > 0 else 2 * (os.cpu_count() or 1)
    with _slots_lock:
        return _slots.setdefault(n, threading.BoundedSemaphore(n))


def _host_git(cwd: str, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "HOME": cwd, "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "task", "GIT_AUTHOR_EMAIL": "task@localhost",
           "GIT_COMMITTER_NAME": "task", "GIT_COMMITTER_EMAIL": "task@localhost",
           "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}
    out = subprocess.run(["git", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise SandboxError(f"git {' '.join(args)} failed in {cwd}: {out.stderr.strip()}")
    return out.stdout.strip()


class LocalWorkspace:
    """A local task's repository in a bubblewrap sandbox with its own uid (held until close)."""

    def __init__(self, task: LocalTask, settings: WorkspaceSettings, pool: UidPool) -> None:
        self.task, self.settings, self.pool = task, settings, pool
        self._lease: UidLease | None = None
        self._dir: str | None = None
        self._base: str | None = None
        self._sandbox: BwrapSandbox | None = None
        self._guard = RunGuard()  # shared by every sandbox of this workspace: close() stops them all

    @property
    def opened(self) -> bool:
        return self._sandbox is not None

    def open(self) -> None:
        if self.opened:
            return
        if not bwrap_available(self.settings.bwrap.bwrap):
            raise SandboxError(
                "local code tasks need root (to switch to sandbox uids) and bubblewrap, setpriv and prlimit: "
                "run as root and `apt-get install bubblewrap util-linux python3-pytest` (make test does)"
            )
        os.makedirs(self.settings.root, mode=0o711, exist_ok=True)
        lease = self.pool.acquire()
        try:
            self._dir = tempfile.mkdtemp(prefix=f"{self.task.name}-", dir=self.settings.root)
            os.chmod(self._dir, 0o711)
            agent = os.path.join(self._dir, "agent")
            os.mkdir(agent)
            self.task.materialize(agent)
            _host_git(agent, "init", "-q")
            _host_git(agent, "add", "-A")
            _host_git(agent, "commit", "-q", "-m", "original")
            self._base = _host_git(agent, "rev-parse", "HEAD")
            chown_tree(agent, lease.uid)
            os.chmod(agent, 0o700)
            self._sandbox = BwrapSandbox(agent, lease.uid, self.settings.bwrap, guard=self._guard)
        except BaseException:
            lease.release()
            self._cleanup_dir()
            raise
        self._lease = lease

    def run(self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None) -> SandboxResult:
        if self._sandbox is None:
            raise SandboxError("LocalWorkspace.run before open() or after close()")
        return self._sandbox.run(command, stdin=stdin, timeout_s=timeout_s)

    def _big(self, workdir: str, cap: int) -> BwrapSandbox:
        assert self._lease is not None
        limits = replace(self.settings.bwrap.limits, max_output_bytes=cap)
        return BwrapSandbox(workdir, self._lease.uid, replace(self.settings.bwrap, limits=limits), guard=self._guard)

    def diff(self) -> str | None:
        """The agent's changes against the original commit (None when they could not be read)."""
        if self._sandbox is None:
            raise SandboxError("LocalWorkspace.diff before open() or after close()")
        result = self._big(self._sandbox.workdir, self.settings.max_patch_bytes).run(
            DIFF_COMMAND.format(base=self._base), timeout_s=60.0)
        return result.text if result.ok else None

    def evaluate(self, patch: str) -> EvalOutcome:
        """Apply ``patch`` to a fresh copy of the original repository and run the task's tests."""
        if self._lease is None or self._dir is None:
            raise SandboxError("LocalWorkspace.evaluate before open() or after close()")
        task = self.task
        patch = filter_patch(patch, task.protects)
        if not patch.strip():
            return EvalOutcome(False, "empty patch (after dropping changes to tests)")
        evaldir = tempfile.mkdtemp(prefix="eval-", dir=self._dir)
        try:
            os.chmod(evaldir, 0o700)
            task.materialize(evaldir)
            chown_tree(evaldir, self._lease.uid)
            box = self._big(evaldir, self.settings.max_log_bytes)
            applied = box.run("git apply --verbose --whitespace=nowarn -", stdin=patch.encode(), timeout_s=60.0)
            if not applied.ok:
                return EvalOutcome(False, "patch did not apply", log=applied.text)
            with grading_slots(self.settings.parallel_tests):
                tests = box.run(pytest_command(task.fail_to_pass + task.pass_to_pass, self.settings.python),
                                timeout_s=self.settings.test_timeout_s)
            return grade_log(task.name, framed_log(tests), task.fail_to_pass, task.pass_to_pass, patch)
        finally:
            shutil.rmtree(evaldir, ignore_errors=True)

    def _cleanup_dir(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def close(self) -> None:
        """Kill whatever still runs (a verdict past its timeout included), then free dirs and uid."""
        if not self._guard.cancel():
            return  # a run refuses to die: keep its uid and directory rather than hand them on
        self._sandbox = None
        self._cleanup_dir()
        if self._lease is not None:
            self._lease.release()
            self._lease = None
