"""A task source whose environments misbehave on purpose (importable by the engine process)."""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from thundersync_lightning.core.errors import HostFault
from thundersync_lightning.core.types import StepResult, derive_seed
from thundersync_lightning.envs.toy import GuessingGameEnv

MODES = (
    "ok",
    "verdict_raises",
    "verdict_hangs",
    "verdict_malformed",
    "step_raises",
    "step_hangs",
    "reset_raises",
)

# Verdict behaviours outside MODES (so the group -> mode mapping of MODES is unchanged):
# a slow verdict (SIMULATED test latency), and verdicts returning garbage of each kind.
GARBAGE = {
    "verdict_nan": math.nan,
    "verdict_inf": -math.inf,
    "verdict_none": None,
    "verdict_list": [1.0],
    "verdict_complex": 1j,
}
SLOW_VERDICT_S = 0.5
# "verdict_env": reward 1.0 where the engine process's environment has ENV_MARK=1, else 0.0
ENV_MARK = "THUNDERSYNC_TEST_ENV_MARK"
# "verdict_stuck" waits for RELEASE: in-process tests set it when done, so no thread outlives them.
RELEASE = threading.Event()


@dataclass(frozen=True, slots=True)
class ScriptedTask:
    secret: int
    mode: str
    gate: str = ""


class ScriptedEnv(GuessingGameEnv):
    def __init__(self, task: ScriptedTask, num_digits: int, max_turns: int) -> None:
        super().__init__(task.secret, num_digits, max_turns)
        self.mode = task.mode
        self.gate = task.gate
        if self.mode == "reset_raises":
            raise RuntimeError("cannot build the sandbox")

    def step(self, action: Sequence[int]) -> StepResult:
        if self.mode == "step_raises":
            raise ValueError("tool crashed")
        if self.mode == "step_host_fault":
            raise HostFault("could not start the sandbox process")
        if self.mode == "step_hangs":
            threading.Event().wait()
        if self.mode == "step_stuck":  # until the test sets RELEASE
            RELEASE.wait()
        if self.mode == "step_gated":  # the engine's main thread waits here until the gate exists
            deadline = time.monotonic() + 60.0
            while self.gate and not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        if self.mode == "nondeterministic" and self.gate and os.path.exists(self.gate):
            return StepResult((self.bad,), False)  # another answer once the gate exists
        return super().step(action)

    def verdict(self) -> float:
        if self.mode == "verdict_raises":
            raise RuntimeError("test runner crashed")
        if self.mode == "verdict_host_fault":
            raise HostFault("the grading sandbox could not start")
        if self.mode == "verdict_hangs":
            threading.Event().wait()
        if self.mode == "verdict_stuck":
            RELEASE.wait()
        if self.mode == "verdict_malformed":
            return "PASSED"  # type: ignore[return-value]
        if self.mode in GARBAGE:
            return GARBAGE[self.mode]  # type: ignore[return-value]
        if self.mode == "verdict_slow":
            time.sleep(SLOW_VERDICT_S)
        if self.mode == "verdict_env":
            return 1.0 if os.environ.get(ENV_MARK) == "1" else 0.0
        if self.mode in (
            "verdict_gated",
            "nondeterministic",
        ):  # the test decides when these verdicts may finish
            deadline = time.monotonic() + 60.0
            while self.gate and not os.path.exists(self.gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        return super().verdict()


@dataclass(frozen=True, slots=True)
class ScriptedTasks:
    """Guessing game (no latency) whose group g behaves as ``modes[g % len(modes)]``.

    ``gate``: a path; "verdict_gated" verdicts wait (up to 60 s) until it exists.
    """

    modes: tuple[str, ...] = ("ok",)
    num_digits: int = 10
    max_turns: int = 4
    gate: str = ""
    max_action_tokens: int = field(default=1, init=False)
    stop_token: int | None = field(default=None, init=False)

    def tasks(self, step: int, num_groups: int, seed: int) -> list[ScriptedTask]:
        return [
            ScriptedTask(
                derive_seed(seed, step, g, -1) % self.num_digits, self.modes[g % len(self.modes)], self.gate
            )
            for g in range(num_groups)
        ]

    def make_env(self, task: ScriptedTask, seed: int) -> ScriptedEnv:
        return ScriptedEnv(task, self.num_digits, self.max_turns)


class CountingEnv(ScriptedEnv):
    def __init__(self, task: ScriptedTask, num_digits: int, max_turns: int, closed: Any) -> None:
        super().__init__(task, num_digits, max_turns)
        self._closed = closed

    def close(self) -> None:
        self._closed.release()


@dataclass(frozen=True, slots=True)
class CountingTasks(ScriptedTasks):
    """ScriptedTasks that count environments: ``made`` is released once per environment created,
    ``closed`` once per environment closed. Pass semaphores of ``multiprocessing.get_context("spawn")``
    to count inside an engine process (they travel with the task source when the process starts)."""

    made: Any = None
    closed: Any = None

    def make_env(self, task: ScriptedTask, seed: int) -> CountingEnv:
        env = CountingEnv(task, self.num_digits, self.max_turns, self.closed)
        self.made.release()
        return env


def take(semaphore: Any, count: int, timeout_s: float = 60.0) -> int:
    """Acquire ``semaphore`` up to ``count`` times, each waiting at most ``timeout_s``; return how many."""
    for k in range(count):
        if not semaphore.acquire(timeout=timeout_s):
            return k
    return count


def drain(semaphore: Any) -> int:
    """Acquire ``semaphore`` without waiting until it is zero; return how many times it was acquired."""
    k = 0
    while semaphore.acquire(False):
        k += 1
    return k
