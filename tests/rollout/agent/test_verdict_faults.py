"""Verdicts that raise, hang or return garbage end as reward 0.0 with a specific reason.

The agent loop runs in process here (the engines run the same loop in their own process or
thread); what a failed trajectory means for the gradient is the learner objective's decision.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from thundersync_lightning.rollout import (
    AgentLoop,
    EnvPool,
    Generation,
    GenerationRequest,
    check_verdict,
    make_request,
)

from ..helpers import collect
from ..scripted import RELEASE, ScriptedTasks

pytestmark = pytest.mark.timeout(60)


def _wrong_guess(requests: Sequence[GenerationRequest]) -> list[Generation]:
    """Always guesses 0 (logprob 0): every episode runs to its turn limit, then its verdict."""
    return [Generation((0,) * r.max_new_tokens, (0.0,) * r.max_new_tokens) for r in requests]


def _rewards_of(mode: str, verdict_timeout_s: float = 10.0) -> dict:
    tasks = ScriptedTasks(modes=(mode,), max_turns=1)
    request = make_request(tasks, step=0, num_groups=1, group_size=2, seed=0)
    pool = EnvPool(4)
    events: list = []
    RELEASE.clear()
    try:
        loop = AgentLoop(tasks, _wrong_guess, pool, verdict_timeout_s=verdict_timeout_s)
        assert loop.run(request, 0, events.append).wait(timeout=30), "not every reward arrived"
    finally:
        RELEASE.set()
        pool.shutdown()
    trajectories, rewards, _ = collect(events)
    assert set(trajectories) == set(rewards) == {"s0-g0-t0", "s0-g0-t1"}
    assert all(t.finish_reason == "turn_limit" for t in trajectories.values())  # the content is intact
    return rewards


@pytest.mark.parametrize(
    ("mode", "reason"),
    [
        ("verdict_raises", "verdict raised RuntimeError: test runner crashed"),
        ("verdict_malformed", "verdict returned str 'PASSED', not a real number"),
        ("verdict_nan", "verdict returned nan"),
        ("verdict_inf", "verdict returned -inf"),
        ("verdict_none", "verdict returned NoneType None, not a real number"),
        ("verdict_list", "verdict returned list [1.0], not a real number"),
        ("verdict_complex", "verdict returned complex 1j, not a real number"),
    ],
)
def test_a_verdict_that_raises_or_returns_garbage_gives_reward_zero_with_the_reason(mode, reason):
    rewards = _rewards_of(mode)
    assert {(r.reward, r.failure) for r in rewards.values()} == {(0.0, reason)}


def test_a_hung_verdict_gives_reward_zero_after_the_verdict_timeout():
    rewards = _rewards_of("verdict_stuck", verdict_timeout_s=0.2)
    assert {(r.reward, r.failure) for r in rewards.values()} == {(0.0, "verdict timed out after 0.2 s")}


def test_a_well_behaved_verdict_has_no_failure():
    rewards = _rewards_of("ok")
    assert {(r.reward, r.failure) for r in rewards.values()} == {(0.0, None)}  # guessed 0, secret != 0


@pytest.mark.parametrize(("value", "reward"), [(1, 1.0), (True, 1.0), (False, 0.0), (0.25, 0.25)])
def test_finite_real_verdicts_pass_through_as_floats(value, reward):
    assert check_verdict(value) == (reward, None)


def test_a_verdict_with_a_huge_repr_is_reported_shortened():
    reward, failure = check_verdict("x" * 10_000)
    assert (
        reward == 0.0 and failure is not None and len(failure) < 200 and failure.endswith("not a real number")
    )


def test_a_weighted_verdict_says_its_failure_its_given_parts_and_whether_it_is_unscorable():
    from thundersync_lightning.core.types import WeightedReward
    from thundersync_lightning.rollout.agent.verdict import Verdict, read_verdict

    # nansum: 2 * 1.0 + (None left out) = 2.0; the parts keep only the values given
    scored = WeightedReward.combine([("fmt", 1.0), ("correct", None)], [2.0, 5.0])
    assert read_verdict(scored) == Verdict(2.0, None, (("fmt", 1.0),), False)
    declined = WeightedReward.combine([("fmt", None), ("correct", None)], [2.0, 5.0])
    assert read_verdict(declined) == Verdict(0.0, None, (), True)
    failed = WeightedReward.combine(
        [("fmt", 1.0), ("correct", None)], [2.0, 5.0], failure="RewardError: boom"
    )
    assert read_verdict(failed) == Verdict(0.0, "RewardError: boom", (("fmt", 1.0),), False)
    assert read_verdict(0.5) == Verdict(0.5, None, (), False)
    assert read_verdict("x").failure == "verdict returned str 'x', not a real number"
