"""hold_after_s: a trajectory of a group still waiting for rewards is backpropagated (held, or into
its group's sums) only once its content has waited that long; ``"auto"`` waits where verdicts land
within a call's time.

The step runner is driven by the tiny bigram policy of ``test_runner_held_bound`` (float64). The event
sources synchronise on the learner's own calls (never on sleeps): a source that withholds the
rewards until the learner has made a call proves the learner held rows; a wait far longer than
the test proves it did not. The gradient is the same whatever the wait.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import torch

from thundersync_lightning.core import PolicySnapshot, StreamingGRPO
from thundersync_lightning.strategy.fit_learner import FitLearner
from thundersync_lightning.strategy.runner import RunnerSettings, StepRunner
from thundersync_lightning.strategy.stats import Interval

from .test_runner_held_bound import TinyPolicy, event, request

SIZES = [4, 4]


class Signalling(StreamingGRPO):
    """Wakes the event source up after every learner call."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.called = threading.Event()

    def add_tokens(self, *args, **kwargs) -> None:
        super().add_tokens(*args, **kwargs)
        self.called.set()


def run(hold_after_s: float, rewards_after_a_call: bool):
    """Every content first, then every reward: at once, or only after the learner's first call
    (so a learner that waits for rewards before holding would wait forever: the source fails)."""
    policy = TinyPolicy()
    req = request(SIZES)
    ids = [t for ts in req.trajectory_ids().values() for t in ts]
    owner = {t: g for g, ts in req.trajectory_ids().items() for t in ts}
    rewards = {t: float(k % 2) for k, t in enumerate(ids)}
    acc = Signalling(list(policy.parameters()))

    def source() -> Iterator:
        for t in ids:
            yield event("content", t, owner[t], rewards)
        if rewards_after_a_call:
            assert acc.called.wait(timeout=120), "the learner never held a row whose reward was withheld"
        for t in ids:
            yield event("reward", t, owner[t], rewards)

    settings = RunnerSettings(hold_after_s=hold_after_s)
    outcome = StepRunner(req, PolicySnapshot(policy), acc, policy.score, settings).run(source())
    acc.finish()
    paths = [i.path for i in outcome.busy if i.kind == "backward"]
    return policy.logits.grad.clone(), paths, outcome


def test_a_wait_longer_than_the_verdicts_lag_backpropagates_every_row_with_its_group_complete():
    # the rewards follow the content at once; a learner that held at once might take held rows
    # first, or a partly rewarded group's rows into its sums; one that waits 600 s cannot (the
    # test ends long before): every row goes with its whole group's rewards known
    grad, paths, outcome = run(600.0, rewards_after_a_call=False)
    assert paths and set(paths) == {"direct"}, paths
    assert outcome.hold_after_s == 600.0
    assert len(outcome.reward_lags) == sum(SIZES) and all(lag >= 0.0 for lag in outcome.reward_lags)
    at_once, held_paths, _ = run(0.0, rewards_after_a_call=True)  # rewards withheld: rows are held
    assert "held" in held_paths
    assert _close(grad, at_once)


def test_a_reward_that_lags_more_than_the_wait_is_held_once_the_wait_is_over():
    # the rewards come only after a call: the learner waits 0.05 s, then holds rows (no hang)
    grad, paths, _ = run(0.05, rewards_after_a_call=True)
    assert paths[0] == "held", paths
    reference, _, _ = run(0.0, rewards_after_a_call=False)
    assert _close(grad, reference)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to summation order (float64): the largest difference against the largest entry."""
    return float((a - b).abs().max()) <= 1e-12 * (float(b.abs().max()) or 1.0)


def _calls(*seconds: float) -> list[Interval]:
    return [Interval(0.0, s, "backward", 4) for s in seconds]


def test_the_automatic_wait_is_the_verdicts_lag_where_it_is_within_a_calls_seconds_else_none():
    learner = FitLearner()
    assert learner.hold_after("auto", "streaming") == 0.0  # nothing seen yet: hold at once
    learner.after_step(_calls(0.2, 0.4), [0.01] * 9 + [0.5])  # 90th percentile 0.01 s, calls 0.3 s
    assert learner.hold_after("auto", "streaming") == pytest.approx(0.01)
    assert learner.hold_after("auto", "async") == pytest.approx(0.01)
    assert learner.hold_after("auto", "sync") == 0.0  # sync's learner starts after the last event
    assert learner.hold_after(0.25, "streaming") == 0.25
    learner.after_step(_calls(0.3), [5.0] * 100)  # an agent's tests: lags far beyond a call
    assert learner.hold_after("auto", "streaming") == 0.0
    learner.clear()
    assert learner.hold_after("auto", "streaming") == 0.0
