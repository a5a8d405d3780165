"""DAPO's soft overlong punishment: the written formula, and the runner shaping each reward with its
trajectory's length in every event order (a reward that lands before its content waits for it)."""

from __future__ import annotations

import random

import pytest
import torch

from thundersync_lightning.core import (
    ConfigError,
    ContentReady,
    GroupRequest,
    Objective,
    PolicySnapshot,
    RewardReady,
    RolloutRequest,
    Segment,
    StreamingGRPO,
    Trajectory,
)
from thundersync_lightning.strategy.runner import RunnerSettings, StepRunner

from .test_runner_held_bound import VOCAB, TinyPolicy

OBJ = Objective(overlong_buffer=4, overlong_max_tokens=6, overlong_penalty=0.5)


@pytest.mark.parametrize("length, penalty", [(0, 0.0), (2, 0.0), (3, 0.125), (5, 0.375), (6, 0.5), (9, 0.5)])
def test_the_penalty_is_zero_then_linear_over_the_window_then_full(length, penalty):
    # DAPO eq. 13 with L_max = 6, L_cache = 4: 0 for L <= 2, (2 - L) / 4 for 2 < L <= 6, -1 beyond; times 0.5
    assert OBJ.shaped_reward(1.0, length) == pytest.approx(1.0 - penalty, abs=1e-15)
    assert Objective().shaped_reward(1.0, length) == 1.0


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"overlong_buffer": 4}, "overlong_buffer and overlong_max_tokens go together"),
        (
            {"overlong_buffer": 8, "overlong_max_tokens": 6},
            "overlong_buffer must be in 1..overlong_max_tokens",
        ),
        ({"overlong_penalty": -1.0}, "overlong_penalty must be a finite number >= 0"),
    ],
)
def test_bad_overlong_settings_are_rejected(fields, match):
    with pytest.raises(ConfigError, match=match):
        Objective(**fields)


def _trajectory(tid: str, gid: str, length: int) -> Trajectory:
    g = torch.Generator().manual_seed(sum(map(ord, tid)))
    action = tuple(int(x) for x in torch.randint(0, VOCAB, (length,), generator=g))
    return Trajectory(tid, gid, 0, (1, 2), (Segment(action, True),), 0, 1, "stop", 0.0, 0.0)


REQ = RolloutRequest(0, (GroupRequest("s0-g0", 0, None, 4), GroupRequest("s0-g1", 1, None, 3)), 0)
LENGTHS = {
    "s0-g0-t0": 1,
    "s0-g0-t1": 4,
    "s0-g0-t2": 7,
    "s0-g0-t3": 3,
    "s0-g1-t0": 5,
    "s0-g1-t1": 5,
    "s0-g1-t2": 2,
}
REWARDS = {
    "s0-g0-t0": 1.0,
    "s0-g0-t1": 1.0,
    "s0-g0-t2": 0.0,
    "s0-g0-t3": 1.0,
    "s0-g1-t0": 1.0,
    "s0-g1-t1": 1.0,
    "s0-g1-t2": 1.0,
}


def _run(seed: int, defer: bool) -> torch.Tensor:
    policy = TinyPolicy()
    acc = StreamingGRPO(list(policy.parameters()), objective=OBJ)
    owner = {t: g for g, ts in REQ.trajectory_ids().items() for t in ts}
    events = [ContentReady(_trajectory(t, g, LENGTHS[t]), 0.0) for t, g in owner.items()]
    events += [RewardReady(t, g, REWARDS[t], 0.0) for t, g in owner.items()]
    random.Random(seed).shuffle(events)
    outcome = StepRunner(REQ, PolicySnapshot(policy), acc, policy.score, RunnerSettings(defer=defer)).run(
        iter(events)
    )
    assert outcome.rewards == {t: OBJ.shaped_reward(REWARDS[t], LENGTHS[t]) for t in owner}
    acc.finish()
    return policy.logits.grad.clone()


def _barrier() -> torch.Tensor:
    policy = TinyPolicy()
    loss = torch.zeros((), dtype=torch.float64)
    for gid, tids in REQ.trajectory_ids().items():
        scores = policy.score([_trajectory(t, gid, LENGTHS[t]) for t in tids])
        s = (scores.logprobs * scores.mask).sum(-1)
        shaped = torch.tensor([OBJ.shaped_reward(REWARDS[t], LENGTHS[t]) for t in tids], dtype=torch.float64)
        loss = loss - (Objective().advantages(shaped) * s).sum()
    (loss / 2).backward()
    return policy.logits.grad.clone()


@pytest.mark.parametrize("seed", range(4))
def test_the_runner_shapes_each_reward_with_its_length_in_any_event_order(seed):
    expected = _barrier()  # g1's raw rewards are all 1: only the penalty gives it a signal
    for defer in (False, True):
        got = _run(seed, defer)
        assert float((got - expected).norm() / expected.norm()) <= 1e-12
