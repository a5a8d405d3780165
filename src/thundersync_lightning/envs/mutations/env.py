"""One episode of a mutation task: choose candidate edits, run the visible tests, submit.

Action language (one token per turn; ``K`` candidates):

    EDIT_i   (0 <= i < K)   write candidate i over ``solution.py``        -> APPLIED
                            (``test_on_edit``: then run the visible tests -> PASS | FAIL)
    TEST                    run the visible tests in the sandbox          -> PASS | FAIL
    REVERT                  restore the buggy file                        -> APPLIED (or PASS | FAIL)
    SUBMIT                  end the episode
    anything else                                                        -> BAD

The prompt is ``[START]``: the policy does not read the code, so what it can learn is the
edit-test-retry strategy (try an edit, run the tests, keep it on PASS, try another on FAIL). A
random policy solves a task by luck about a fifth of the time (K=4); the strategy solves all.
``test_on_edit`` makes an edit a compound "edit and run the visible tests" action (as agent
scaffolds often do): the same runs, one decision fewer per attempt, and much faster learning.

Every TEST and every verdict is a real run in a bubblewrap sandbox (``python3 -I`` on a plain
script, without pytest's start-up cost). A TEST prints pytest-style ``PASSED``/``FAILED`` lines,
read by swebench's pytest log parser (what the agent sees). The verdict runs the hidden cases'
arguments only and prints one ``RESULT <i> <repr>`` line per case; the host compares each value,
parsed as a Python literal, with the expected one (which never enters the sandbox), so neither a
printed ``PASSED`` line nor a returned object whose ``__eq__`` says yes can pass a case, and a case
answered twice fails. The pytest-style log the host builds from that is graded by swebench's
FAIL_TO_PASS / PASS_TO_PASS report (:func:`~thundersync_lightning.envs.repo.grading.grade_log`).

Native tool calls (``conversation``): the same task as a small repository. The prompt names the
buggy function in ``solution.py`` and the visible tests (``python3 -I test_visible.py``); the
model reads, edits and tests with ``bash`` / ``str_replace_editor`` and calls ``submit``. The
verdict grades ``solution.py`` as the agent left it, with the same hidden tests.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import stat
import tempfile
import threading
from collections.abc import Sequence

from ...core.types import StepResult
from ..repo.grading import EvalOutcome, framed_log, grade_log
from ..sandbox.base import SandboxError, SandboxResult
from ..sandbox.bwrap import BwrapConfig, BwrapSandbox, bwrap_available, chown_tree
from ..sandbox.fs import BoundedDir, release_workdir, sweep_stale
from ..sandbox.uids import UidLease, UidPool
from ..tools import ToolConversation
from .generate import MutationTask

__all__ = [
    "ActionVocab",
    "MutationEnv",
    "test_script",
    "result_script",
    "graded_log",
    "parse_results",
    "tools_prompt",
]


def tools_prompt(task: MutationTask) -> str:
    """The task in words, for a model that acts through tools."""
    return (
        f"The function `{task.function}` in solution.py has a bug: some of its visible tests fail. "
        "Fix solution.py. Run the visible tests with `python3 -I test_visible.py` (they print PASSED or "
        "FAILED per test). Call submit when they pass: hidden tests then decide your reward."
    )


class ActionVocab:
    """Token ids of the action language for ``k`` candidates (actions first, then observations)."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.test, self.revert, self.submit = k, k + 1, k + 2
        self.passed, self.failed, self.applied, self.bad, self.start = k + 3, k + 4, k + 5, k + 6, k + 7

    @property
    def size(self) -> int:
        return self.k + 8


def _load(function: str) -> str:
    """Script lines that bind ``fn`` to ``function`` of the agent's ``solution.py`` (None when it fails)."""
    return (
        "ns = {}\n"
        "try:\n"
        "    with open('solution.py') as f:\n"
        "        exec(compile(f.read(), 'solution.py', 'exec'), ns)\n"
        f"    fn = ns[{function!r}]\n"
        "except BaseException as exc:\n"
        "    fn = None\n"
        "    print('ERROR loading solution.py:', type(exc).__name__, exc)\n"
    )


def test_script(function: str, cases: Sequence[tuple[str, tuple, object]], file: str) -> str:
    """A plain Python test script printing one pytest-style status line per case."""
    rows = ",\n    ".join(repr((name, args, expected)) for name, args, expected in cases)
    return (
        f"CASES = [\n    {rows},\n]\n" + _load(function) + "for name, args, expected in CASES:\n"
        "    try:\n"
        "        ok = fn is not None and fn(*args) == expected\n"
        "    except Exception:\n"
        "        ok = False\n"
        f"    print(('PASSED' if ok else 'FAILED') + ' {file}::' + name)\n"
    )


def result_script(function: str, cases: Sequence[tuple[str, tuple, object]]) -> str:
    """A plain script printing ``RESULT <i> <repr(fn(*args))>`` per case (arguments only: the
    expected values stay on the host, see :func:`graded_log`)."""
    args = [a for _, a, _ in cases]
    return (
        f"ARGS = {args!r}\n" + _load(function) + "for i, args in enumerate(ARGS):\n"
        "    try:\n"
        "        value = repr(fn(*args))\n"
        "    except Exception:\n"
        "        value = '<raised>'\n"
        "    print('RESULT', i, value.replace('\\n', ' '), flush=True)\n"
    )


_RESULT = re.compile(r"^RESULT (\d+) (.*)$")


def graded_log(output: str, cases: Sequence[tuple[str, tuple, object]], file: str) -> str:
    """pytest-style status lines for ``cases`` from the ``RESULT`` lines of a :func:`result_script`
    run: a case passes when exactly one line answers it and its value, parsed on the host as a
    Python literal (never executed), equals the expected one."""
    answers: dict[int, list[str]] = {}
    for line in output.splitlines():
        m = _RESULT.match(line)
        if m is not None:
            answers.setdefault(int(m.group(1)), []).append(m.group(2))
    out = []
    for i, (name, _, expected) in enumerate(cases):
        given = answers.get(i, [])
        ok = False
        if len(given) == 1:
            try:
                ok = bool(ast.literal_eval(given[0]) == expected)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                ok = False
        out.append(f"{'PASSED' if ok else 'FAILED'} {file}::{name}\n")
    return "".join(out)


def parse_results(log: str) -> dict[str, str]:
    """swebench's pytest parser on a test run's output: test id -> PASSED / FAILED / ..."""
    from swebench.harness.log_parsers.python import parse_log_pytest

    return parse_log_pytest(log, None)


class MutationEnv:
    """A workspace (own directory and sandbox uid) for one episode of one :class:`MutationTask`."""

    def __init__(
        self,
        task: MutationTask,
        vocab: ActionVocab,
        pool: UidPool,
        root: str,
        bwrap: BwrapConfig,
        python: str = "python3",
        test_on_edit: bool = False,
        conversation: ToolConversation | None = None,
    ) -> None:
        self.test_on_edit = test_on_edit
        self.conversation = conversation
        self.task, self.vocab, self.pool, self.root = task, vocab, pool, root
        self.bwrap, self.python = bwrap, python
        self._lease: UidLease | None = None
        self._dir: str | None = None
        self._budget: BoundedDir | None = None
        self._box: BwrapSandbox | None = None
        self._current = task.buggy
        self._lock = threading.Lock()
        self._outcome: EvalOutcome | None = None
        self.tests_run = 0

    # ------------------------------------------------------------------ workspace
    def _write(self, name: str, text: str) -> None:
        """Write a fresh file ``name`` for the sandbox uid. Whatever the agent left under that name
        (a symlink to a host file, a FIFO) is removed first and never followed."""
        assert self._dir is not None and self._lease is not None
        path = os.path.join(self._dir, name)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except IsADirectoryError:
            os.rename(path, f"{path}.{os.urandom(4).hex()}")  # a directory in its place: move it aside
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            os.fchown(fd, self._lease.uid, self._lease.uid)

    def _run(self, script: str) -> SandboxResult:
        assert self._box is not None
        return self._box.run(f"{self.python} -I {script}")

    def reset(self) -> tuple[int, ...]:
        if self._box is None:
            if not bwrap_available(self.bwrap.bwrap):
                raise SandboxError(
                    "mutation tasks need root and bubblewrap, setpriv, prlimit (make test installs them)"
                )
            os.makedirs(self.root, mode=0o711, exist_ok=True)
            self._lease = self.pool.acquire()
            try:
                marker = f"-u{self._lease.uid}-"
                sweep_stale(self.root, marker)  # left by a holder of this uid that died
                self._dir = tempfile.mkdtemp(prefix=f"{self.task.task_id}{marker}", dir=self.root)
                lim = self.bwrap.limits
                self._budget = BoundedDir(
                    self._dir,
                    lim.disk_bytes,
                    lim.disk_inodes,
                    0o700,
                    require=self.bwrap.require_kernel_limits,
                )
                chown_tree(self._dir, self._lease.uid)
                os.chmod(self._dir, 0o700)
                self._write(
                    "test_visible.py", test_script(self.task.function, self.task.visible, "test_visible.py")
                )
                self._box = BwrapSandbox(self._dir, self._lease.uid, self.bwrap, budget=self._budget)
            except BaseException:
                self.close()
                raise
        self._current = self.task.buggy
        self._write("solution.py", self._current)
        if self.conversation is not None:
            return self.conversation.start([{"role": "user", "content": tools_prompt(self.task)}])
        return (self.vocab.start,)

    # ------------------------------------------------------------------ actions
    def step(self, action: Sequence[int]) -> StepResult:
        if self.conversation is not None:
            if self._box is None:
                raise RuntimeError("MutationEnv.step before reset() or after close()")
            turn = self.conversation.respond(action, self._box)
            self._current = self._read_solution()
            return StepResult(turn.observation, turn.done, turn.calls, turn.invalid)
        v = self.vocab
        token = action[-1] if action else -1
        if 0 <= token < v.k or token == v.revert:
            self._current = self.task.candidates[token] if token < v.k else self.task.buggy
            self._write("solution.py", self._current)
            return StepResult((self._test() if self.test_on_edit else v.applied,), False)
        if token == v.test:
            return StepResult((self._test(),), False)
        if token == v.submit:
            return StepResult((), True)
        return StepResult((v.bad,), False)

    def _test(self) -> int:
        """Run the visible tests in the sandbox; PASS when swebench's parser reads every one as PASSED."""
        self.tests_run += 1
        statuses = parse_results(self._run("test_visible.py").text)
        ok = len(statuses) == len(self.task.visible) and all(s == "PASSED" for s in statuses.values())
        return self.vocab.passed if ok else self.vocab.failed

    def _read_solution(self) -> str:
        """``solution.py`` as the agent's commands left it (missing, not a regular file, or a link: empty).

        Read on the host without following links or blocking on a FIFO: the sandbox's user made it."""
        assert self._dir is not None
        try:
            fd = os.open(os.path.join(self._dir, "solution.py"), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return ""
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return ""
            return f.read(1 << 20).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------ verdict
    def patch(self) -> str:
        """The agent's change as a unified diff of ``solution.py`` (empty when nothing changed)."""
        return "".join(
            difflib.unified_diff(
                self.task.buggy.splitlines(keepends=True),
                self._current.splitlines(keepends=True),
                "a/solution.py",
                "b/solution.py",
            )
        )

    def outcome(self) -> EvalOutcome:
        """Hidden tests on the final file, graded with swebench's FAIL_TO_PASS / PASS_TO_PASS report."""
        with self._lock:
            if self._outcome is None:
                patch = self.patch()
                if self._box is None:
                    self._outcome = EvalOutcome(False, "the episode never started or was closed")
                elif not patch:
                    self._outcome = EvalOutcome(False, "empty patch: the buggy file was submitted")
                else:
                    # on stdin, not a file: nothing is written into the agent's directory, so a
                    # directory the agent filled to its disk budget is graded like any other
                    assert self._box is not None
                    run = self._box.run(
                        f"{self.python} -I -",
                        stdin=result_script(self.task.function, self.task.hidden).encode(),
                    )
                    log = framed_log(run, graded_log(run.text, self.task.hidden, "test_hidden.py"))
                    self._outcome = grade_log(
                        self.task.task_id, log, self.task.fail_to_pass, self.task.pass_to_pass, patch
                    )
            return self._outcome

    def verdict(self) -> float:
        return self.outcome().reward

    def close(self) -> None:
        """Kill what still runs, free the workspace (its bounded mount) and release the uid. Never raises."""
        box, self._box = self._box, None
        try:
            if box is not None:
                box.close()
        finally:
            budget, path, lease = self._budget, self._dir, self._lease
            self._budget = self._dir = self._lease = None
            release_workdir(budget, path, lease)
