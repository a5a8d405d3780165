"""top_entropy_quantile in the step runner: refused where it cannot be exact (streaming, async),
applied in sync with the step's own threshold, equal to the barrier form over the whole step."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest
import torch

from thundersync_lightning.core import (
    ConfigError,
    ContentReady,
    Objective,
    PolicySnapshot,
    RewardReady,
    StreamingGRPO,
    TokenScores,
    Trajectory,
    reference_loss,
    trajectory_terms,
)
from thundersync_lightning.core.grpo.terms import entropy_threshold
from thundersync_lightning.strategy.runner import RunnerSettings, StepRunner

from .test_runner_held_bound import TinyPolicy, request, trajectory

OBJ = Objective(loss_agg="token-mean", entropy_coef=0.05, top_entropy_quantile=0.4)


class EntropyPolicy(TinyPolicy):
    """The bigram policy with each position's entropy (a graph to the table)."""

    def score(self, trajectories: Sequence[Trajectory], prefix: object = None) -> TokenScores:
        base = super().score(trajectories)
        table = torch.log_softmax(self.logits, dim=-1)
        per_row = -(table.exp() * table).sum(-1)  # (V,)
        width = base.logprobs.shape[1]
        ent = torch.stack([
            torch.nn.functional.pad(per_row[torch.tensor(t.tokens[:-1])], (0, width - len(t.tokens) + 1))
            for t in trajectories
        ])  # fmt: skip
        return TokenScores(base.logprobs, base.mask, ent)


REQ = request([3, 2, 3])
REWARDS = {t: float(i % 3 == 0) for i, t in enumerate(t for ts in REQ.trajectory_ids().values() for t in ts)}


def _events(seed: int) -> list:
    owner = {t: g for g, ts in REQ.trajectory_ids().items() for t in ts}
    events = [ContentReady(trajectory(t, g), 0.0) for t, g in owner.items()]
    events += [RewardReady(t, g, REWARDS[t], 0.0) for t, g in owner.items()]
    random.Random(seed).shuffle(events)
    return events


def test_streaming_refuses_a_step_wide_entropy_threshold_and_says_why():
    policy = EntropyPolicy()
    acc = StreamingGRPO(list(policy.parameters()), objective=OBJ)
    with pytest.raises(ConfigError, match="known only once the last trajectory landed.*Use mode='sync'"):
        StepRunner(REQ, PolicySnapshot(policy), acc, policy.score)


@pytest.mark.parametrize("seed", range(3))
def test_sync_applies_the_steps_own_threshold(seed):
    policy = EntropyPolicy()
    acc = StreamingGRPO(list(policy.parameters()), objective=OBJ)
    runner = StepRunner(
        REQ, PolicySnapshot(policy), acc, policy.score, RunnerSettings(defer=True, max_batch_trajectories=3)
    )
    runner.run(iter(_events(seed)))
    acc.finish()
    got = policy.logits.grad.clone()
    policy.logits.grad = None
    owner = {t: g for g, ts in REQ.trajectory_ids().items() for t in ts}
    trajs = [trajectory(t, g) for t, g in owner.items()]
    scores = policy.score(trajs)
    threshold = entropy_threshold(OBJ.top_entropy_quantile, [scores.entropy[scores.mask]])
    terms = trajectory_terms(OBJ, replace(scores, entropy_threshold=threshold), None)
    reference_loss(OBJ, terms, list(owner.values()), [REWARDS[t] for t in owner]).backward()
    expected = policy.logits.grad.clone()
    assert float((got - expected).norm() / expected.norm()) <= 1e-12
    everything = trajectory_terms(replace(OBJ, top_entropy_quantile=1.0), policy.score(trajs), None)
    policy.logits.grad = None
    reference_loss(
        replace(OBJ, top_entropy_quantile=1.0), everything, list(owner.values()), [REWARDS[t] for t in owner]
    ).backward()
    assert float((policy.logits.grad - expected).norm() / expected.norm()) > 1e-6  # the selection acts
