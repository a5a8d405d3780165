"""Dynamic sampling in the accumulator: a group without signal counts nowhere, so the streamed
gradient equals the barrier reference over the kept groups alone, in any event order."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thundersync_lightning.core import Objective, StreamingGRPO
from thundersync_lightning.core.grpo.group_filter import informative

from ..grpo.test_objective import _random_events, batches, objectives
from ..objective_helpers import Batch, TokenPolicy, barrier, params_of, rel, streamed, synchronous


def kept_groups(batch: Batch, obj: Objective) -> Batch:
    """The batch less its groups without signal, written independently of the accumulator."""
    groups = {}
    for gid, tids in batch.groups.items():
        kept = [
            t for t in tids if not (batch.failed[t] and obj.failed == "drop") and not batch.unscorable.get(t)
        ]
        graded = [batch.rewards[t] for t in kept if not batch.failed[t]]
        floor = min(graded) if graded else 0.0  # a failure scores the worst graded reward of its group
        floor = obj.failure_reward if obj.failure_reward is not None else floor
        rewards = {floor if batch.failed[t] else batch.rewards[t] for t in kept}
        if len(rewards) > 1 or (len(kept) == 1 and obj.singleton == "reward"):
            groups[gid] = tids
    return Batch(groups, batch.rewards, batch.failed, batch.unscorable)


@settings(max_examples=40, deadline=None)
@given(obj=objectives, batch=batches(), seed=st.integers(0, 2**16), chunk=st.integers(1, 3))
def test_filtered_groups_count_nowhere_in_any_event_order(obj, batch, seed, chunk):
    policy = TokenPolicy(torch.float64, seed=seed % 7)
    kept = kept_groups(batch, obj)
    if not kept.groups:
        reference = torch.zeros_like(barrier(policy, obj, batch))
    else:
        reference = barrier(policy, obj, kept)
    for got in (
        synchronous(policy, obj, batch, filter_groups=True),
        streamed(policy, obj, batch, _random_events(batch, seed), chunk, filter_groups=True),
    ):
        if float(reference.norm()) == 0.0:
            assert float(got.norm()) == 0.0
        else:
            assert rel(got, reference) <= 1e-12


def test_an_all_equal_group_with_kl_and_entropy_changes_nothing_and_is_reported():
    obj = Objective(loss_agg="token-mean", kl_coef=0.2, entropy_coef=0.05, scale="batch")
    batch = Batch(
        {"g0": ("a0", "a1", "a2"), "g1": ("b0", "b1"), "g2": ("c0", "c1")},
        {"a0": 1.0, "a1": 0.0, "a2": 0.5, "b0": 1.0, "b1": 1.0, "c0": 0.0, "c1": 0.0},
        {t: False for t in ("a0", "a1", "a2", "b0", "b1", "c0", "c1")},
    )
    policy = TokenPolicy(torch.float64, seed=3)
    alone = Batch({"g0": batch.groups["g0"]}, batch.rewards, batch.failed)
    expected = barrier(policy, obj, alone)
    assert rel(barrier(policy, obj, batch), expected) > 1e-6  # without the filter, g1 and g2 would count
    events = _random_events(batch, 4)
    assert rel(streamed(policy, obj, batch, events, filter_groups=True), expected) <= 1e-12
    params = params_of(policy)
    acc = StreamingGRPO(params, objective=obj, filter_groups=True)
    for gid, ts in batch.groups.items():
        acc.open_group(gid, ts)
    for t in batch.order:
        acc.add_reward(t, batch.rewards[t])
    assert not acc.needs_score("b0")  # a filtered group's content needs no forward
    acc.add_tokens(batch.order, policy.scores(batch.order))
    report = acc.finish()
    assert (report.groups_folded, report.groups_filtered, report.totals.groups) == (1, 2, 1.0)
    for p in params:
        p.grad = None


def test_a_group_can_be_aborted_until_its_last_verdict_even_with_r_terms():
    obj = Objective(kl_coef=0.2)
    policy = TokenPolicy(torch.float64, seed=5)
    acc = StreamingGRPO(params_of(policy), objective=obj, filter_groups=True)
    acc.open_group("g", ("a0", "a1"))
    acc.add_reward("a0", 1.0)
    acc.add_tokens(["a0", "a1"], policy.scores(["a0", "a1"]))  # R of both: into the group's R sum
    acc.abort_group("g")
    assert acc.finish().groups_aborted == 1


@pytest.mark.parametrize("singleton_trains", [True, False])
def test_informative_means_two_distinct_rewards_or_a_singleton_that_trains(singleton_trains):
    assert informative([0.0, 1.0], singleton_trains)
    assert not informative([0.7, 0.7, 0.7], singleton_trains)
    assert informative([1.0], singleton_trains) is singleton_trains
    assert not informative([], singleton_trains)
