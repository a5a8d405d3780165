"""Turns and episodes with a budget: calls per turn, a turn's deadline, its characters and tokens,
the last observation within the context, and ``max_episode_tokens()`` against any policy.

Before: every call of a turn ran and was answered with no cap (a branch episode with many calls
per turn passed the ``max_episode_tokens()`` it declared, the bound the memory planner sizes
activations with; a code task's turn returned several times its observation limit), the last
observation was appended past ``max_context_tokens``, and after a step timeout the failed
episode's calls kept starting (its close queued behind them in the saturated pool).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thundersync_lightning.core.types import ContentReady, StepResult
from thundersync_lightning.envs.branches import BranchTasks
from thundersync_lightning.envs.code import LocalCodeTasks
from thundersync_lightning.envs.codec import ByteCodec
from thundersync_lightning.envs.repo.episode import OBSERVATION_FRAME_BYTES
from thundersync_lightning.envs.sandbox import RunGuard
from thundersync_lightning.envs.tools import Tool, ToolConversation, ToolResult, TurnBudget
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.rollout import AgentLoop, EnvPool, Generation, GenerationRequest, make_request

from .._support import needs_bwrap
from ..repo.test_tools import model_dir
from .test_tools_calls import renderer, sampled


def call(tool: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': tool, 'arguments': arguments})}</tool_call>"


def counting_tool(output: str = "ok") -> tuple[Tool, list[int]]:
    ran: list[int] = []

    def handler(sandbox: object, args: dict) -> ToolResult:
        ran.append(1)
        return ToolResult(output)

    return Tool("echo", "Echo.", {"type": "object", "properties": {}}, handler), ran


def test_calls_past_the_turns_limit_are_answered_together_without_running():
    r = renderer()
    tool, ran = counting_tool()
    conv = ToolConversation(r, [tool], budget=TurnBudget(max_calls=3))
    conv.start([{"role": "user", "content": "go"}])
    turn = conv.respond(sampled(r, call("echo") * 20), sandbox=None)
    assert len(ran) == 3 and (turn.calls, turn.invalid) == (20, 17)  # before: all 20 ran
    assert "[not run] 17 more call(s): at most 3 calls per turn" in r.tokenizer.decode(turn.observation)


def test_no_call_starts_once_the_turns_deadline_has_passed(monkeypatch):
    from thundersync_lightning.envs.tools import conversation

    now = [0.0]
    monkeypatch.setattr(conversation.time, "monotonic", lambda: now[0])
    r = renderer()
    ran: list[int] = []

    def slow(sandbox: object, args: dict) -> ToolResult:  # each call takes 10 s of the turn
        ran.append(1)
        now[0] += 10.0
        return ToolResult("done")

    conv = ToolConversation(
        r, [Tool("slow", "Slow.", {"type": "object"}, slow)], budget=TurnBudget(max_calls=8, deadline_s=25.0)
    )
    conv.start([{"role": "user", "content": "go"}])
    turn = conv.respond(sampled(r, call("slow") * 6), sandbox=None)
    assert len(ran) == 3 and turn.invalid == 3  # started at 0, 10 and 20 s; none at 30 s
    assert "the turn's deadline of 25 s has passed" in r.tokenizer.decode(turn.observation)


def test_a_turns_results_together_stay_within_its_character_budget():
    r = renderer()
    tool, _ = counting_tool("x" * 5000)
    conv = ToolConversation(r, [tool], max_result_chars=4096, budget=TurnBudget(max_calls=8, max_chars=1000))
    conv.start([{"role": "user", "content": "go"}])
    conv.respond(sampled(r, call("echo") * 8), sandbox=None)
    results = [m["content"] for m in conv.messages if m["role"] == "tool"]
    assert len(results) == 8
    assert sum(len(c) for c in results) <= 1000 + 8 * 40  # each cut adds one short note


# -- max_episode_tokens() against adversarial policies ----------------------------------------


def _policy(kind: str, texts: Sequence[str], tokenizer: object, vocab: int, seed: int):  # noqa: ANN202
    """A GenerateFn writing, up to each request's budget: random ids, or the given texts' ids (many
    calls per turn, unknown tools, huge arguments), with or without the stop token."""
    import random

    rng = random.Random(seed)

    def generate(requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for req in requests:
            if kind == "random" or tokenizer is None:
                ids = [rng.randrange(vocab) for _ in range(req.max_new_tokens)]
            else:
                ids = list(tokenizer.encode(rng.choice(texts), add_special_tokens=False))[
                    : req.max_new_tokens
                ]
            if req.stop_token is not None and rng.random() < 0.5 and len(ids) < req.max_new_tokens:
                ids.append(req.stop_token)
            out.append(Generation(tuple(ids), (0.0,) * len(ids)))
        return out

    return generate


def _episodes(tasks: object, generate: object, groups: int = 2, size: int = 2) -> list:  # noqa: ANN401
    pool = EnvPool(4)
    events: list = []
    try:
        loop = AgentLoop(tasks, generate, pool, coalesce_s=0)  # type: ignore[arg-type]
        assert loop.run(make_request(tasks, 0, groups, size, 0), 0, events.append).wait(timeout=120)  # type: ignore[arg-type]
    finally:
        pool.shutdown()
    return [e.trajectory for e in events if isinstance(e, ContentReady)]


BRANCH_TEXTS = [
    call("delete_branch", name="docs") * 30,
    call("nope" + "x" * 200, name="y" * 500) * 10,
    call("create_branch", name="z" * 2000),
    "<tool_call>{" * 200,
    "".join(call(t, name=b) for t in ("switch_branch", "create_branch") for b in ("q" * 300, "main")),
]


@pytest.fixture(scope="module")
def branch_tasks() -> BranchTasks:
    return BranchTasks(model_dir(), max_turns=2, max_action_tokens=400)


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(kind=st.sampled_from(["random", "calls"]), seed=st.integers(0, 2**16))
def test_no_branch_episode_exceeds_max_episode_tokens_whatever_the_policy_writes(branch_tasks, kind, seed):
    tok = branch_tasks.renderer.tokenizer
    generate = _policy(kind, BRANCH_TEXTS, tok, len(tok), seed)
    bound = branch_tasks.max_episode_tokens()
    for traj in _episodes(branch_tasks, generate):
        assert len(traj.tokens) <= bound, (
            len(traj.tokens),
            bound,
        )  # before: past it with many calls per turn


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(seed=st.integers(0, 2**16), turns=st.integers(1, 6), digits=st.integers(2, 10))
def test_no_guessing_game_episode_exceeds_max_episode_tokens(seed, turns, digits):
    tasks = GuessingGameTasks(latency="none", max_turns=turns, num_digits=digits)
    for traj in _episodes(tasks, _policy("random", (), None, digits + 8, seed)):
        assert len(traj.tokens) <= tasks.max_episode_tokens()


# -- the context and the step timeout -----------------------------------------------------------


class _Chatty:
    """An environment whose every observation is 1000 tokens."""

    def reset(self) -> tuple[int, ...]:
        return (1, 2, 3)

    def step(self, action: Sequence[int]) -> StepResult:
        return StepResult((7,) * 1000, False)

    def verdict(self) -> float:
        return 0.0

    def close(self) -> None:
        pass


class _ChattyTasks(GuessingGameTasks):
    def make_env(self, task: object, seed: int) -> _Chatty:  # type: ignore[override]
        return _Chatty()


def test_the_last_observation_is_cut_to_the_context_and_the_episode_ends_by_length():
    tasks = _ChattyTasks(latency="none", max_turns=5)
    pool = EnvPool(2)
    events: list = []
    try:
        loop = AgentLoop(tasks, _policy("random", (), None, 5, 0), pool, max_context_tokens=300)
        assert loop.run(make_request(tasks, 0, 1, 2, 0), 0, events.append).wait(timeout=30)
    finally:
        pool.shutdown()
    trajs = [e.trajectory for e in events if isinstance(e, ContentReady)]
    assert all(len(t.tokens) <= 300 and t.finish_reason == "length" for t in trajs)  # before: 1000 past it


class _Commands:
    """An environment whose step runs ``n`` commands through a RunGuard (what a workspace's
    sandboxes share: its close cancels the guard, and no command starts after it)."""

    def __init__(
        self, n: int, first: threading.Event, release: threading.Event, closed: threading.Event
    ) -> None:
        self.n, self.first, self.release, self.closed = n, first, release, closed
        self.guard = RunGuard()
        self.started = 0

    def reset(self) -> tuple[int, ...]:
        return (1,)

    def step(self, action: Sequence[int]) -> StepResult:
        for _ in range(self.n):
            try:
                self.guard.enter()
            except Exception:  # noqa: BLE001 - refused after close: the command does not start
                continue
            try:
                self.started += 1
                if self.started == 1:
                    self.first.set()
                    self.release.wait(timeout=30)
            finally:
                self.guard.exit()
        return StepResult((2,), False)

    def verdict(self) -> float:
        return 0.0

    def close(self) -> None:
        self.guard.cancel(wait_s=0.0)  # refuse new commands (a workspace also kills the running ones)
        self.closed.set()


def test_after_a_step_timeout_no_further_command_of_the_ended_episode_starts():
    first, release, closed = threading.Event(), threading.Event(), threading.Event()
    env = _Commands(8, first, release, closed)

    class Tasks(GuessingGameTasks):
        def make_env(self, task: object, seed: int) -> _Commands:  # type: ignore[override]
            return env

    tasks = Tasks(latency="none", max_turns=1)
    pool = EnvPool(1)  # saturated by the overrunning step: a close queued there would wait for it
    events: list = []
    try:
        loop = AgentLoop(tasks, _policy("random", (), None, 5, 0), pool, step_timeout_s=0.2)
        done = loop.run(make_request(tasks, 0, 1, 1, 0), 0, events.append)
        assert first.wait(timeout=10)
        assert closed.wait(timeout=10)  # before: the close queued behind the step, which never ended
    finally:
        release.set()
        assert done.wait(timeout=30)
        pool.shutdown()
    assert env.started == 1  # before: the other 7 commands started once released


# -- code tasks: a turn's observation within max_observation_bytes -------------------------------


@needs_bwrap
@pytest.mark.parametrize("fmt", ["text", "tools"])
def test_a_code_tasks_turn_stays_within_its_observation_bytes(fmt):
    extra = {"tokenizer_path": model_dir()} if fmt == "tools" else {}
    tasks = LocalCodeTasks(
        names=["leap_year"],
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_960_000,
        uid_count=64,
        max_observation_bytes=512,
        action_format=fmt,
        **extra,
    )
    env = tasks.make_env(tasks.all_tasks[0], 0)
    try:
        env.reset()
        if fmt == "tools":
            text = call("bash", command="head -c 3000 /dev/urandom | base64") * 8
            ids = (*tasks.renderer.tokenizer.encode(text, add_special_tokens=False), tasks.stop_token)
            env.step(ids)
            results = [m["content"] for m in env.conversation.messages if m["role"] == "tool"]
            assert sum(len(c) for c in results) <= 512 + 8 * 40  # before: 8 results of up to 1 kB each
        else:
            codec = ByteCodec()
            for action in ("bash head -c 3000 /dev/urandom", "\u00e9" * 400 + " not an action"):
                obs = env.step(codec.encode(action) + (ByteCodec.END_OF_ACTION,)).observation
                assert len(obs) <= 512 + OBSERVATION_FRAME_BYTES  # before: U+FFFD tripled the bytes
    finally:
        env.close()


def test_a_code_turns_deadline_and_one_command_fit_in_the_engines_step_timeout_by_default():
    from thundersync_lightning.core.protocols import STEP_TIMEOUT_S
    from thundersync_lightning.envs.code.workspace import COMMAND_TIMEOUT_S
    from thundersync_lightning.envs.tools import TurnBudget

    # the last call of a turn may start at its deadline and then run one command's timeout
    assert TurnBudget().deadline_s + COMMAND_TIMEOUT_S < STEP_TIMEOUT_S
