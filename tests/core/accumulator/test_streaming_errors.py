"""Bad input: each case raises its own exception and leaves the accumulator as it was.

Every test proves "state unchanged" the same way: after the error it completes the step with the
correct events and the streamed gradient still equals the barrier reference.
"""

from __future__ import annotations

import math

import pytest
import torch

from thundersync_lightning.core import (
    AccumulatorSpentError,
    DuplicateEventError,
    GroupError,
    InvalidLogprobError,
    InvalidRewardError,
    OpenGroupsError,
    PolicyChangedError,
    StreamingGRPO,
    ThunderSyncError,
    UnknownTrajectoryError,
)

from ..helpers import Batch, MLPPolicy, clear_grads, deliver, grads_of, reference_gradient, relative_error

# g0: three trajectories, binary; g1: three distinct rewards (collapse path); g2: rewards known first.
BATCH = Batch.of([1.0, 0.0, 1.0], [0.5, 2.0, -1.0], [1.0, 0.0])
# Some of every kind of state before the bad call: held gradients (g0-t0), a sum (g1), a direct group.
PREFIX = [
    ("logprob", "g0-t0"),
    ("reward", "g1-t0"),
    ("logprob", "g1-t0"),
    ("logprob", "g1-t1"),
    ("reward", "g1-t1"),
    ("reward", "g2-t0"),
    ("reward", "g2-t1"),
    ("logprob", "g2-t0"),
]


@pytest.fixture
def policy() -> MLPPolicy:
    return MLPPolicy(torch.float64)


@pytest.fixture
def params(policy) -> list[torch.Tensor]:
    return list(policy.parameters())


@pytest.fixture
def acc(policy, params) -> StreamingGRPO:
    """An accumulator in the middle of a step: every group open, some events delivered."""
    clear_grads(params)
    acc = StreamingGRPO(params)
    for gid, members in BATCH.groups.items():
        acc.open_group(gid, members)
    deliver(acc, BATCH, policy.score, PREFIX)
    return acc


def complete_and_check(acc: StreamingGRPO, policy: MLPPolicy, params) -> None:
    """Deliver the rest of BATCH; the step must equal the reference as if nothing had happened."""
    bytes_before = acc.bytes_in_use
    open_before = acc.open_groups
    assert open_before == ("g0", "g1", "g2") and bytes_before.total > 0
    deliver(acc, BATCH, policy.score, [e for e in BATCH.events() if e not in PREFIX])
    report = acc.finish()
    assert relative_error(grads_of(params), reference_gradient(params, BATCH, policy.score)) <= 1e-12
    assert (report.num_groups, report.trajectories, report.backward_passes) == (3, 8, 8)


@pytest.mark.parametrize("reward", [math.nan, math.inf, -math.inf, "1.0x", None])
def test_a_non_finite_or_non_numeric_reward_raises_invalid_reward(acc, policy, params, reward):
    with pytest.raises(InvalidRewardError, match="g0-t1"):
        acc.add_reward("g0-t1", reward)
    complete_and_check(acc, policy, params)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("trajectory", ["g0-t1", "g2-t1"], ids=["held", "direct"])
def test_a_non_finite_logprob_raises_invalid_logprob(acc, policy, params, bad, trajectory):
    with pytest.raises(InvalidLogprobError, match="must be finite"):
        acc.add_logprob(trajectory, policy.score(trajectory) + bad)
    complete_and_check(acc, policy, params)


@pytest.mark.parametrize("trajectory", ["g0-t1", "g2-t1"], ids=["held", "direct"])
def test_a_logprob_computed_without_grad_raises_invalid_logprob(acc, policy, params, trajectory):
    with torch.no_grad():
        detached = policy.score(trajectory)
    with pytest.raises(InvalidLogprobError, match="does not require grad"):
        acc.add_logprob(trajectory, detached)
    complete_and_check(acc, policy, params)


@pytest.mark.parametrize("trajectory", ["g0-t1", "g2-t1"], ids=["held", "direct"])
def test_a_logprob_from_an_unrelated_graph_raises_invalid_logprob(acc, policy, params, trajectory):
    stranger = torch.randn(4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(InvalidLogprobError, match="no autograd path to the parameters"):
        acc.add_logprob(trajectory, torch.log_softmax(stranger, 0)[0])
    assert stranger.grad is None
    complete_and_check(acc, policy, params)


def test_a_logprob_that_is_not_a_scalar_raises_invalid_logprob(acc, policy, params):
    pair = torch.stack([policy.score("g0-t1"), policy.score("g0-t2")])
    with pytest.raises(InvalidLogprobError, match="scalar"):
        acc.add_logprob("g0-t1", pair)
    complete_and_check(acc, policy, params)


@pytest.mark.parametrize("event", ["reward", "logprob"])
def test_an_event_for_an_unknown_trajectory_raises_unknown_trajectory(acc, policy, params, event):
    with pytest.raises(UnknownTrajectoryError, match="'g9-t0' is unknown; declare it with open_group"):
        if event == "reward":
            acc.add_reward("g9-t0", 1.0)
        else:
            acc.add_logprob("g9-t0", policy.score("g0-t1"))
    complete_and_check(acc, policy, params)


@pytest.mark.parametrize("event", ["reward", "logprob"])
def test_a_second_event_of_the_same_kind_for_a_trajectory_raises_duplicate_event(acc, policy, params, event):
    # g0-t0 has a logprob; g1-t0 has both (its group is still open).
    with pytest.raises(DuplicateEventError, match=f"already has a {event}"):
        if event == "reward":
            acc.add_reward("g1-t0", 0.5)
        else:
            acc.add_logprob("g0-t0", policy.score("g0-t0"))
    complete_and_check(acc, policy, params)


def test_an_event_for_a_trajectory_of_a_folded_group_raises_duplicate_event(policy, params):
    clear_grads(params)
    acc = StreamingGRPO(params)
    deliver(acc, BATCH, policy.score, [e for e in BATCH.events() if e[1].startswith("g0")])
    assert "g0" not in acc.open_groups
    with pytest.raises(DuplicateEventError, match="already folded"):
        acc.add_reward("g0-t0", 1.0)
    deliver(acc, BATCH, policy.score, [e for e in BATCH.events() if not e[1].startswith("g0")])
    acc.finish()
    assert relative_error(grads_of(params), reference_gradient(params, BATCH, policy.score)) <= 1e-12


def test_a_group_listing_a_trajectory_twice_raises_duplicate_event(acc, policy, params):
    with pytest.raises(DuplicateEventError, match="lists a trajectory id twice"):
        acc.open_group("g3", ["g3-t0", "g3-t0"])
    complete_and_check(acc, policy, params)


def test_a_trajectory_in_two_groups_raises_duplicate_event_naming_its_group(acc, policy, params):
    with pytest.raises(DuplicateEventError, match="already belong to group 'g0'"):
        acc.open_group("g3", ["g3-t0", "g0-t1"])
    complete_and_check(acc, policy, params)


def test_opening_the_same_group_twice_raises_a_group_error(acc, policy, params):
    with pytest.raises(GroupError, match="already opened"):
        acc.open_group("g0", ["g0-t0", "g0-t1", "g0-t2"])
    complete_and_check(acc, policy, params)


def test_a_group_of_size_zero_raises_a_group_error(acc, policy, params):
    with pytest.raises(GroupError, match="has no trajectories"):
        acc.open_group("g3", [])
    complete_and_check(acc, policy, params)


def test_finish_with_open_groups_names_each_group_and_its_missing_events(acc, policy, params):
    with pytest.raises(OpenGroupsError) as info:
        acc.finish()
    message = str(info.value)
    assert (
        "group 'g0' misses rewards of ['g0-t0', 'g0-t1', 'g0-t2'] and logprobs of ['g0-t1', 'g0-t2']"
        in message
    )
    assert "group 'g1' misses rewards of ['g1-t2'] and logprobs of ['g1-t2']" in message
    assert "group 'g2' misses rewards of [] and logprobs of ['g2-t1']" in message
    assert "abort_group" in message
    assert all(p.grad is None for p in params)
    complete_and_check(acc, policy, params)


@pytest.mark.parametrize(
    "call",
    [
        lambda acc, score: acc.open_group("g3", ["g3-t0"]),
        lambda acc, score: acc.add_reward("g0-t0", 1.0),
        lambda acc, score: acc.add_logprob("g0-t0", score("g0-t0")),
        lambda acc, score: acc.abort_group("g0"),
        lambda acc, score: acc.finish(),
    ],
    ids=["open_group", "add_reward", "add_logprob", "abort_group", "finish"],
)
def test_any_call_after_finish_raises_accumulator_spent(policy, params, call):
    clear_grads(params)
    acc = StreamingGRPO(params)
    deliver(acc, BATCH, policy.score, BATCH.events())
    acc.finish()
    after = grads_of(params)
    with pytest.raises(AccumulatorSpentError, match="reset"):
        call(acc, policy.score)
    assert relative_error(grads_of(params), after) == 0.0


def test_a_parameter_changed_in_place_mid_step_raises_policy_changed_at_finish(acc, policy, params):
    deliver(acc, BATCH, policy.score, [e for e in BATCH.events() if e not in PREFIX])
    with torch.no_grad():
        params[2].mul_(1.0)  # any in-place write counts, even one that keeps the values
    with pytest.raises(PolicyChangedError, match=r"indices \[2\]"):
        acc.finish()
    assert all(p.grad is None for p in params)  # nothing was stepped on


def test_an_optimizer_step_before_the_barrier_raises_policy_changed(policy, params):
    clear_grads(params)
    acc = StreamingGRPO(params)
    deliver(acc, BATCH, policy.score, BATCH.events())
    for p in params:
        p.grad = torch.ones_like(p)
    torch.optim.SGD(params, lr=0.1).step()
    with pytest.raises(PolicyChangedError, match="mix two"):
        acc.finish()


def test_invalid_constructor_arguments_are_reported_together(params):
    frozen = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(ThunderSyncError) as info:
        StreamingGRPO([params[0], params[0], frozen], eps=-1.0, max_open_groups=0)
    message = str(info.value)
    for problem in ("require grad", "same tensor twice", "eps must be", "max_open_groups"):
        assert problem in message
    with pytest.raises(ThunderSyncError, match="params is empty"):
        StreamingGRPO([])
