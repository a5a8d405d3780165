"""Where a local task's agent works and where its patch is graded: bubblewrap sandboxes on the host.

Layout: one private directory per workspace under ``root`` (a size- and inode-limited tmpfs of
its own where the host allows it, see :mod:`..sandbox.fs`) holding

* ``agent/``: the repository as the agent sees it (the FAIL_TO_PASS tests cut out), a git
  repository at that state, owned by the sandbox uid;
* ``base.git``: a root-owned bare copy of that commit, bound read-only when the patch is captured
  (so the agent's git config, hooks and filters are never used; see :mod:`..repo.patches`);
* ``runner/``: the host-written test runner and pytest.ini (see :mod:`..repo.runner`), bound read-only;
* for each verdict, a fresh copy of the ORIGINAL repository (hidden tests included), in a
  directory beside the workspace's with a disk and inode budget of its own (a workspace the agent
  filled to its budget is graded like any other): the agent's filtered patch is applied there, the
  tree is then made root-owned and read-only (the code under test cannot rewrite a test file before
  pytest collects it), and the tests run there, so nothing the agent left behind (caches, test
  edits, background processes, a full disk) reaches the grading run.

:meth:`LocalWorkspace.close` never raises and always releases the uid lease.
"""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
from dataclasses import dataclass, field, replace

from ..repo.grading import EvalOutcome, grade_runner_run
from ..repo.patches import BASE_GIT_DIR, capture_command, filter_patch
from ..repo.runner import RUNNER_DIR, new_key, runner_command, write_runner
from ..sandbox.base import RunGuard, SandboxError, SandboxLimits, SandboxResult
from ..sandbox.bwrap import BwrapConfig, BwrapSandbox, bwrap_available, chown_tree
from ..sandbox.fs import BoundedDir, release_workdir, remove_tree, sweep_stale
from ..sandbox.uids import UidLease, UidPool
from .task import LocalTask

__all__ = ["WorkspaceSettings", "LocalWorkspace", "grading_slots"]

log = logging.getLogger(__name__)
_warned_budget = False

#: The defaults of one agent command's and of the grading test run's limits (``LocalCodeTasks``'s too).
COMMAND_TIMEOUT_S = 20.0
TEST_TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class WorkspaceSettings:
    """Sandbox settings of local workspaces. ``python`` runs the tests inside the sandbox (it must
    import pytest and be readable by an unprivileged uid: Debian's python3 + python3-pytest, or a
    venv listed in ``bwrap.ro_binds``). ``parallel_tests`` bounds the grading runs of this process
    (0: twice the CPU count; CPU-bound suites saturate the cores well before that)."""

    bwrap: BwrapConfig = field(
        default_factory=lambda: BwrapConfig(SandboxLimits(timeout_s=COMMAND_TIMEOUT_S))
    )
    root: str = "/tmp/thundersync-sandboxes"
    python: str = "python3"
    test_timeout_s: float = TEST_TIMEOUT_S
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
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": "/nonexistent",
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
        "GIT_AUTHOR_NAME": "task",
        "GIT_AUTHOR_EMAIL": "task@localhost",
        "GIT_COMMITTER_NAME": "task",
        "GIT_COMMITTER_EMAIL": "task@localhost",
        "GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z",
        "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z",
    }
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
        self._budget: BoundedDir | None = None
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
        self._lease = lease
        try:
            sweep_stale(self.settings.root, f"-u{lease.uid}-")  # left by a holder of this uid that died
            self._dir = tempfile.mkdtemp(prefix=f"{self.task.name}-u{lease.uid}-", dir=self.settings.root)
            self._mount_budget(self._dir)
            agent = os.path.join(self._dir, "agent")
            os.mkdir(agent)
            self.task.materialize(agent, visible=True)
            _host_git(agent, "init", "-q")
            _host_git(agent, "add", "-A")
            _host_git(agent, "commit", "-q", "-m", "original")
            self._base = _host_git(agent, "rev-parse", "HEAD")
            _host_git(self._dir, "clone", "-q", "--bare", "--no-hardlinks", agent, "base.git")
            subprocess.run(["chmod", "-R", "a+rX,go-w", os.path.join(self._dir, "base.git")], check=True)
            write_runner(os.path.join(self._dir, "runner"))
            chown_tree(agent, lease.uid)
            os.chmod(agent, 0o700)
            self._sandbox = BwrapSandbox(
                agent, lease.uid, self.settings.bwrap, budget=self._budget, guard=self._guard
            )
        except BaseException:
            self.close()
            raise

    def _mount_budget(self, path: str) -> None:
        global _warned_budget
        lim = self.settings.bwrap.limits
        self._budget = BoundedDir(
            path, lim.disk_bytes, lim.disk_inodes, 0o711, require=self.settings.bwrap.require_kernel_limits
        )
        if not self._budget.enforced and not _warned_budget:
            _warned_budget = True
            log.warning(
                "workspace disk/inode budget not enforced (tmpfs mount failed: %s); the agent can fill "
                "the host's disk under %s",
                self._budget.why_not,
                self.settings.root,
            )

    def run(
        self, command: str, *, stdin: bytes | None = None, timeout_s: float | None = None
    ) -> SandboxResult:
        if self._sandbox is None:
            raise SandboxError("LocalWorkspace.run before open() or after close()")
        return self._sandbox.run(command, stdin=stdin, timeout_s=timeout_s)

    def _big(self, workdir: str, cap: int, budget: BoundedDir | None = None) -> BwrapSandbox:
        assert self._lease is not None and self._dir is not None and self._budget is not None
        limits = replace(self.settings.bwrap.limits, max_output_bytes=cap)
        ro = {
            os.path.join(self._dir, "base.git"): BASE_GIT_DIR,
            os.path.join(self._dir, "runner"): RUNNER_DIR,
        }
        return BwrapSandbox(
            workdir,
            self._lease.uid,
            replace(self.settings.bwrap, limits=limits),
            budget=budget or self._budget,
            guard=self._guard,
            ro_binds=ro,
        )

    def diff(self) -> str | None:
        """The agent's changes against the original commit, git's stdout only, computed with the
        host's git directory and configuration (None when they could not be read)."""
        if self._sandbox is None or self._base is None:
            raise SandboxError("LocalWorkspace.diff before open() or after close()")
        result = self._big(self._sandbox.workdir, self.settings.max_patch_bytes).run(
            capture_command(self._base), timeout_s=60.0
        )
        return result.text if result.ok else None

    def evaluate(self, patch: str) -> EvalOutcome:
        """Apply ``patch`` to a fresh copy of the original repository and run the task's tests."""
        if self._lease is None or self._dir is None:
            raise SandboxError("LocalWorkspace.evaluate before open() or after close()")
        task = self.task
        patch = filter_patch(patch, task.protects)
        if not patch.strip():
            return EvalOutcome(False, "empty patch (after dropping changes to tests, or unparseable)")
        # Beside the workspace (same uid marker: swept with it), on a budget of its own.
        evaldir = tempfile.mkdtemp(prefix=f"{task.name}-u{self._lease.uid}-eval-", dir=self.settings.root)
        lim = self.settings.bwrap.limits
        try:
            budget = BoundedDir(
                evaldir,
                lim.disk_bytes,
                lim.disk_inodes,
                0o700,
                require=self.settings.bwrap.require_kernel_limits,
            )
        except BaseException:
            remove_tree(evaldir)
            raise
        try:
            task.materialize(evaldir)
            chown_tree(evaldir, self._lease.uid)
            box = self._big(evaldir, self.settings.max_log_bytes, budget)
            applied = box.run(
                "GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null git apply --whitespace=nowarn -",
                stdin=patch.encode(),
                timeout_s=60.0,
            )
            if not applied.ok:
                return EvalOutcome(False, "patch did not apply", log=applied.text)
            _freeze(evaldir)  # the code under test must not rewrite tests that are not yet collected
            key = new_key()
            with grading_slots(self.settings.parallel_tests):
                tests = box.run(
                    runner_command(task.fail_to_pass + task.pass_to_pass, self.settings.python),
                    stdin=(key + "\n").encode(),
                    timeout_s=self.settings.test_timeout_s,
                )
            # The task's own files say which graded tests may legitimately be skipped or xfail.
            return grade_runner_run(
                task.name, tests, key, task.fail_to_pass, task.pass_to_pass, patch, declared=dict(task.files)
            )
        finally:
            budget.remove()

    def close(self) -> None:
        """Kill whatever still runs (a verdict past its timeout included), free the directories
        and release the uid. Never raises; the uid is released even when a run would not die
        (its processes are then killed by uid before the lease goes)."""
        try:
            if not self._guard.cancel():
                log.warning("a sandbox run of %s did not end; killing the uid's processes", self.task.name)
                if self._lease is not None:
                    _kill_uid(self._lease.uid)
        except Exception as e:  # noqa: BLE001 - clean-up never raises
            log.warning("cancelling the runs of %s failed: %s", self.task.name, e)
        finally:
            self._sandbox = None
            budget, path, lease = self._budget, self._dir, self._lease
            self._budget = self._dir = self._lease = None
            release_workdir(budget, path, lease)


def _freeze(path: str) -> None:
    """Make the tree at ``path`` root-owned and read-only to everyone else (readable, searchable)."""
    for cmd in (["chown", "-R", "-P", "0:0", path], ["chmod", "-R", "a+rX,go-w", path]):
        subprocess.run(cmd, check=True, capture_output=True, timeout=600)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process whose real uid is ``uid`` (a sandbox uid: nothing else runs as it)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.stat(f"/proc/{entry}").st_uid == uid:
                os.kill(int(entry), 9)
        except OSError:
            continue
