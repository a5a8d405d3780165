"""max_held_trajectories: the runner never holds more reward-pending gradients than the bound.

The step runner is driven by an event source that delivers one event at a time and then waits
until the learner has caught up (it holds as many pending gradients as the bound and the pending
trajectories allow), so every fuzzed event order plays out the same way on every run. The
gradient must equal the unbounded one and the synchronous one (float64: up to summation order).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

from thundersync_lightning.core import (
    ContentReady,
    GroupRequest,
    PolicySnapshot,
    RewardReady,
    RolloutRequest,
    Segment,
    StreamingGRPO,
    TokenScores,
    Trajectory,
)
from thundersync_lightning.strategy.runner import RunnerSettings, StepRunner

VOCAB = 6


class TinyPolicy(nn.Module):
    """A bigram softmax policy (float64): S_i = sum over scored tokens of log pi(y_t | y_{t-1})."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.logits = nn.Parameter(torch.randn(VOCAB, VOCAB, dtype=torch.float64))

    def score(self, trajectories: Sequence[Trajectory], prefix: object = None) -> TokenScores:
        width = max(len(t.tokens) for t in trajectories) - 1
        logprobs = torch.zeros(len(trajectories), width, dtype=torch.float64)
        mask = torch.zeros(len(trajectories), width, dtype=torch.bool)
        table = torch.log_softmax(self.logits, dim=-1)  # (V, V)
        rows = []
        for i, t in enumerate(trajectories):
            tokens = torch.tensor(t.tokens)
            n = len(t.tokens) - 1
            rows.append(torch.cat([table[tokens[:-1], tokens[1:]], logprobs[i, n:]]))  # (width,)
            mask[i, :n] = torch.tensor(t.scored_mask[1:])
        return TokenScores(torch.stack(rows), mask)


def request(group_sizes: Sequence[int]) -> RolloutRequest:
    groups = tuple(GroupRequest(f"s0-g{g}", g, None, size) for g, size in enumerate(group_sizes))
    return RolloutRequest(step=0, groups=groups, seed=0)


def trajectory(tid: str, gid: str) -> Trajectory:
    g = torch.Generator().manual_seed(sum(map(ord, tid)))
    action = tuple(int(x) for x in torch.randint(0, VOCAB, (3,), generator=g))
    return Trajectory(tid, gid, 0, (1, 2), (Segment(action, True),), 0, 1, "stop", 0.0, 0.0)


class Recording(StreamingGRPO):
    """Counts held gradients after every call and wakes the event source up."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.changed = threading.Condition()
        self.held_seen: list[int] = []

    def add_tokens(self, *args, **kwargs) -> None:
        super().add_tokens(*args, **kwargs)
        self._note()

    def add_reward(self, *args, **kwargs) -> None:
        super().add_reward(*args, **kwargs)
        self._note()

    def _note(self) -> None:
        with self.changed:
            self.held_seen.append(self.held_trajectories)
            self.changed.notify_all()


def event(kind: str, tid: str, gid: str, rewards: dict[str, float]):
    if kind == "content":
        return ContentReady(trajectory(tid, gid), 0.0)
    return RewardReady(tid, gid, rewards[tid], 0.0)


def plain(order, req: RolloutRequest, rewards: dict[str, float]) -> Iterator:
    owner = {t: g for g, ts in req.trajectory_ids().items() for t in ts}
    return iter([event(kind, tid, owner[tid], rewards) for kind, tid in order])


def lockstep(order, req: RolloutRequest, rewards: dict[str, float], acc: Recording, bound: int | None):
    """Yield the events in ``order``; after each, wait until the learner holds what it may hold."""
    owner = {t: g for g, ts in req.trajectory_ids().items() for t in ts}
    content, rewarded = set(), set()
    for kind, tid in order:
        (content if kind == "content" else rewarded).add(tid)
        yield event(kind, tid, owner[tid], rewards)
        pending = len(content - rewarded)
        expected = pending if bound is None else min(bound, pending)
        with acc.changed:
            caught_up = acc.changed.wait_for(lambda n=expected: acc.held_trajectories == n, timeout=60)
        assert caught_up, f"the learner holds {acc.held_trajectories} gradients, expected {expected}"


def run_runner(order, group_sizes, rewards, bound: int | None, defer: bool = False):
    """(policy, accumulator, outcome) of one step driven by ``order`` (lockstep unless ``defer``)."""
    policy = TinyPolicy()
    req = request(group_sizes)
    acc = Recording(list(policy.parameters()), max_held_trajectories=bound)
    runner = StepRunner(req, PolicySnapshot(policy), acc, policy.score, RunnerSettings(defer=defer))
    outcome = runner.run(plain(order, req, rewards) if defer else lockstep(order, req, rewards, acc, bound))
    return policy, acc, outcome


def run_step(order, group_sizes, rewards, bound: int | None, defer: bool = False):
    policy, acc, _ = run_runner(order, group_sizes, rewards, bound, defer)
    report = acc.finish()
    return policy.logits.grad.clone(), report, acc.held_seen


@st.composite
def steps(draw):
    sizes = draw(st.lists(st.integers(2, 4), min_size=1, max_size=3))
    req = request(sizes)
    ids = [t for ts in req.trajectory_ids().values() for t in ts]
    rewards = {t: float(draw(st.sampled_from([0.0, 1.0, 0.5]))) for t in ids}
    order = draw(st.permutations([(k, t) for t in ids for k in ("content", "reward")]))
    return sizes, rewards, order


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(step=steps(), bound=st.integers(0, 3))
def test_held_gradients_never_exceed_the_bound_and_the_gradient_is_unchanged(step, bound):
    sizes, rewards, order = step
    bounded, report, held = run_step(order, sizes, rewards, bound)
    unbounded, free_report, _ = run_step(order, sizes, rewards, None)
    assert max(held) <= bound
    assert report.peak_held_trajectories <= bound
    # the lockstep source lets the learner fill the bound whenever enough trajectories are pending
    assert report.peak_held_trajectories == min(bound, free_report.peak_held_trajectories)
    assert report.peak_held_bytes == report.peak_held_trajectories * bounded.numel() * 8
    scale = float(unbounded.abs().max()) or 1.0
    assert float((bounded - unbounded).abs().max()) / scale <= 1e-12


def test_a_zero_bound_never_holds_and_equals_the_synchronous_gradient():
    sizes = [3, 2]
    req = request(sizes)
    ids = [t for ts in req.trajectory_ids().values() for t in ts]
    rewards = dict(zip(ids, [1.0, 0.0, 0.5, 1.0, 0.0]))
    order = [("content", t) for t in ids] + [("reward", t) for t in reversed(ids)]
    never, report, held = run_step(order, sizes, rewards, 0)
    sync, _, _ = run_step(order, sizes, rewards, None, defer=True)
    assert set(held) == {0} and report.peak_held_trajectories == report.peak_held_bytes == 0
    assert float((never - sync).abs().max()) / float(sync.abs().max()) <= 1e-12


def backward_calls(order, sizes, rewards, bound: int | None, defer: bool = False) -> list[tuple[str, int]]:
    _, _, outcome = run_runner(order, sizes, rewards, bound, defer)
    return [(iv.path, iv.trajectories) for iv in outcome.busy if iv.kind == "backward"]


def test_each_backward_call_records_how_many_trajectories_it_took_and_the_rule_that_chose_them():
    sizes = [3, 2]
    req = request(sizes)
    ids = [t for ts in req.trajectory_ids().values() for t in ts]
    rewards = dict(zip(ids, [1.0, 0.0, 0.5, 1.0, 0.0]))
    order = [("content", t) for t in ids] + [("reward", t) for t in ids]
    # every content lands before any reward and the learner catches up after each: five lone passes
    assert backward_calls(order, sizes, rewards, None) == [("held", 1)] * 5
    # the synchronous learner starts after the last event: every group complete, one call
    assert backward_calls(order, sizes, rewards, None, defer=True) == [("direct", 5)]
    # nothing may be held: each trajectory waits for its reward (a bucket, or
    # direct once its group is complete)
    calls = backward_calls(order, sizes, rewards, 0)
    assert {path for path, _ in calls} <= {"bucket", "direct"}
    assert sum(n for _, n in calls) == 5
