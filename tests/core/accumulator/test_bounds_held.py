"""max_held_trajectories in the accumulator: refusals change nothing, counts and bytes are exact."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thundersync_lightning.core import AccumulatorBounds, ConfigError, HeldGradientLimitError, StreamingGRPO

from ..helpers import Batch, MLPPolicy, clear_grads, grads_of, reference_gradient, relative_error


@pytest.fixture(scope="module")
def policy() -> MLPPolicy:
    return MLPPolicy(torch.float64)


def buffer_bytes(params) -> int:
    return sum(p.numel() for p in params) * params[0].element_size()


def test_holding_beyond_the_bound_raises_and_changes_nothing(policy):
    params = list(policy.parameters())
    batch = Batch.of([1.0, 0.0, 0.5])
    acc = StreamingGRPO(params, max_held_trajectories=1)
    acc.open_group("g0", batch.groups["g0"])
    acc.add_logprob("g0-t0", policy.score("g0-t0"))  # reward pending: held
    before = (acc.held_trajectories, acc.bytes_in_use, acc.peak_bytes)
    with pytest.raises(HeldGradientLimitError, match=r"\['g0-t1'\].*max_held_trajectories=1"):
        acc.add_logprob("g0-t1", policy.score("g0-t1"))
    assert (acc.held_trajectories, acc.bytes_in_use, acc.peak_bytes) == before
    acc.add_reward("g0-t1", 0.0)
    acc.add_logprob("g0-t1", policy.score("g0-t1"))  # its reward is known now: joins a sum, holds nothing
    assert acc.held_trajectories == 1
    acc.add_reward("g0-t0", 1.0)  # frees the held gradient into the sum for reward 1
    assert acc.held_trajectories == 0


def test_a_zero_bound_refuses_every_hold_but_accepts_scores_with_known_rewards(policy):
    params = list(policy.parameters())
    acc = StreamingGRPO(params, max_held_trajectories=0)
    acc.open_group("g0", ("g0-t0", "g0-t1"))
    with pytest.raises(HeldGradientLimitError, match="max_held_trajectories=0"):
        acc.add_logprob("g0-t0", policy.score("g0-t0"))
    acc.add_reward("g0-t0", 1.0)
    acc.add_logprob("g0-t0", policy.score("g0-t0"))
    acc.add_reward("g0-t1", 0.0)
    acc.add_logprob("g0-t1", policy.score("g0-t1"))
    report = acc.finish()
    assert (report.peak_held_trajectories, report.peak_held_bytes) == (0, 0)


def test_negative_bounds_are_rejected_and_none_or_zero_are_accepted(policy):
    params = list(policy.parameters())
    with pytest.raises(ConfigError, match="max_held_trajectories must be >= 0"):
        StreamingGRPO(params, max_held_trajectories=-1)
    assert StreamingGRPO(params, max_held_trajectories=0).max_held_trajectories == 0
    assert StreamingGRPO(params).max_held_trajectories is None


def test_aborting_a_group_releases_its_held_gradients_from_the_count(policy):
    params = list(policy.parameters())
    acc = StreamingGRPO(params, max_held_trajectories=2)
    acc.open_group("g0", ("g0-t0", "g0-t1"))
    acc.add_logprob("g0-t0", policy.score("g0-t0"))
    acc.add_logprob("g0-t1", policy.score("g0-t1"))
    assert acc.held_trajectories == 2
    acc.abort_group("g0")
    assert acc.held_trajectories == 0
    assert acc.peak_held_bytes == 2 * buffer_bytes(params)


@st.composite
def orders(draw):
    sizes = draw(st.lists(st.integers(2, 4), min_size=1, max_size=3))
    batch = Batch.of(*[[float(draw(st.sampled_from([0.0, 1.0, 3.0]))) for _ in range(n)] for n in sizes])
    events = draw(st.permutations(batch.events()))
    return batch, events


@settings(max_examples=40, deadline=None)
@given(case=orders(), bound=st.integers(0, 3))
def test_a_caller_that_retries_refused_scores_after_their_reward_gets_the_exact_gradient(policy, case, bound):
    # Every refused score is delivered right after its reward instead: the bound is never
    # exceeded, and the refusals leave no trace in the gradient.
    batch, events = case
    params = list(policy.parameters())
    clear_grads(params)
    acc = StreamingGRPO(params, max_held_trajectories=bound)
    for gid, members in batch.groups.items():
        acc.open_group(gid, members)
    refused, held = set(), []
    for kind, tid in events:
        if kind == "reward":
            acc.add_reward(tid, batch.rewards[tid])
            if tid in refused:
                acc.add_logprob(tid, policy.score(tid))
        else:
            try:
                acc.add_logprob(tid, policy.score(tid))
            except HeldGradientLimitError:
                refused.add(tid)
        held.append(acc.held_trajectories)
    report = acc.finish()
    assert max(held) <= bound and report.peak_held_trajectories == max(held)
    assert report.peak_held_bytes == max(held) * buffer_bytes(params)
    assert relative_error(grads_of(params), reference_gradient(params, batch, policy.score)) <= 1e-12


def test_the_bounds_are_one_object_checked_where_it_is_made_and_taken_whole_by_the_accumulator(policy):
    params = list(policy.parameters())
    with pytest.raises(ConfigError, match="max_open_groups must be >= 1.*max_held_trajectories must be >= 0"):
        AccumulatorBounds(max_open_groups=0, max_held_trajectories=-1)
    acc = StreamingGRPO(params, bounds=AccumulatorBounds(max_open_groups=2, max_held_trajectories=0))
    assert (acc.max_open_groups, acc.max_held_trajectories) == (2, 0)
    with pytest.raises(ConfigError, match="give bounds or its shorthands"):
        StreamingGRPO(params, bounds=AccumulatorBounds(max_open_groups=2), max_open_groups=3)
