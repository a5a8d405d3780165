"""StreamingGRPO behaviour: direct path, zero-advantage groups, aborts, scaling, .grad, admission,
byte accounting and the report. Reference values come from the barrier reference in helpers."""

from __future__ import annotations

import pytest
import torch

from thundersync_lightning.core import (
    GroupError,
    OpenGroupLimitError,
    StreamingGRPO,
    UnknownTrajectoryError,
    advantages,
)

from ..helpers import (
    Batch,
    MLPPolicy,
    clear_grads,
    deliver,
    grads_of,
    reference_gradient,
    relative_error,
    stream,
)


@pytest.fixture
def policy() -> MLPPolicy:
    return MLPPolicy(torch.float64)


@pytest.fixture
def params(policy) -> list[torch.Tensor]:
    return list(policy.parameters())


def rewards_then_logprobs(batch: Batch) -> list[tuple[str, str]]:
    return batch.events()


def logprobs_then_rewards(batch: Batch) -> list[tuple[str, str]]:
    events = batch.events()
    return [e for e in events if e[0] == "logprob"] + [e for e in events if e[0] == "reward"]


def buffer_bytes(params) -> int:
    return sum(p.numel() for p in params) * params[0].element_size()


# ----------------------------------------------------------------------------- direct path
def test_a_group_whose_rewards_are_all_known_first_is_backpropagated_directly(policy, params):
    batch = Batch.of([1.0, 0.0, 1.0, 0.5])
    got, report = stream(params, batch, policy.score, rewards_then_logprobs(batch))
    assert relative_error(got, reference_gradient(params, batch, policy.score)) <= 1e-12
    assert report.backward_passes == 4
    assert report.skipped_backward_passes == 0
    # No group sums and no held gradients: only the step's gradient buffer was ever allocated.
    assert report.peak_bytes.device == buffer_bytes(params)
    assert report.peak_bytes.pageable_host == report.peak_bytes.pinned_host == 0


def test_a_direct_trajectory_whose_advantage_is_exactly_zero_skips_its_backward(policy, params):
    # drgrpo on [0, 1, 2]: mu = 1, so the middle trajectory has A = 1 - 1 = 0 exactly.
    batch = Batch.of([0.0, 1.0, 2.0])
    got, report = stream(params, batch, policy.score, rewards_then_logprobs(batch), estimator="drgrpo")
    assert relative_error(got, reference_gradient(params, batch, policy.score, "drgrpo")) <= 1e-12
    assert (report.backward_passes, report.skipped_backward_passes) == (2, 1)


# ----------------------------------------------------------------------------- zero advantage
def test_an_equal_reward_group_contributes_zero_but_counts_as_a_group(policy, params):
    batch = Batch.of([1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    got, report = stream(params, batch, policy.score, logprobs_then_rewards(batch))
    alone = reference_gradient(params, batch.without("g1"), policy.score, num_groups=2)
    assert relative_error(got, alone) <= 1e-12
    assert report.num_groups == report.groups_folded == 2
    assert report.groups[1].reward_mean == 1.0 and report.groups[1].reward_std == 0.0


def test_an_equal_reward_group_whose_rewards_come_first_skips_every_backward_pass(policy, params):
    batch = Batch.of([0.0, 0.0, 0.0, 0.0, 0.0])
    got, report = stream(params, batch, policy.score, rewards_then_logprobs(batch))
    assert all(bool((g == 0).all()) for g in got)
    assert (report.backward_passes, report.skipped_backward_passes) == (0, 5)
    assert report.peak_bytes.total == 0
    assert report.objective == 0.0


def test_finish_leaves_a_zero_gradient_not_none_when_every_group_has_zero_advantage(policy, params):
    # The synchronous step (loss.backward on a zero loss) leaves zero gradients, and optimizers such
    # as AdamW still apply momentum and weight decay to them; a None .grad makes them skip the
    # parameter, so the streamed update would differ from the synchronous one.
    batch = Batch.of([1.0, 1.0], [0.0, 0.0, 0.0])
    clear_grads(params)
    acc = StreamingGRPO(params)
    deliver(acc, batch, policy.score, logprobs_then_rewards(batch))
    acc.finish()
    assert all(p.grad is not None and bool((p.grad == 0).all()) for p in params)


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_a_group_of_one_trajectory_has_zero_advantage(policy, params, estimator):
    batch = Batch.of([1.0, 0.0], [5.0])
    assert advantages([5.0], estimator).tolist() == [0.0]
    got, report = stream(params, batch, policy.score, logprobs_then_rewards(batch), estimator=estimator)
    alone = reference_gradient(params, batch.without("g1"), policy.score, estimator, num_groups=2)
    assert relative_error(got, alone) <= 1e-12
    assert report.num_groups == 2


# ----------------------------------------------------------------------------- aborts
@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_an_aborted_group_leaves_no_gradient_no_count_and_no_bytes(policy, params, offload):
    batch = Batch.of([1.0, 0.0, 0.5], [0.0, 1.0, 2.0, 3.0], [1.0, 0.0])
    clear_grads(params)
    acc = StreamingGRPO(params, offload=offload)
    # g1 gets held gradients and collapsed sums (3 distinct rewards), then is aborted.
    deliver(acc, batch, policy.score, [("logprob", "g1-t0"), ("logprob", "g1-t1"), ("reward", "g1-t0")])
    deliver(acc, batch, policy.score, [("reward", "g1-t1"), ("reward", "g1-t2"), ("logprob", "g1-t2")])
    assert acc.bytes_in_use.total > 0
    acc.abort_group("g1")
    assert acc.bytes_in_use.total == 0
    assert acc.open_groups == ()
    with pytest.raises(UnknownTrajectoryError):
        acc.add_reward("g1-t3", 3.0)
    deliver(acc, batch, policy.score, batch.without("g1").events())
    report = acc.finish()
    kept = batch.without("g1")
    assert relative_error(grads_of(params), reference_gradient(params, kept, policy.score)) <= 1e-12
    assert (report.groups_folded, report.groups_aborted, report.num_groups) == (2, 1, 2)
    assert [s.group_id for s in report.groups] == ["g0", "g2"]


def test_aborting_a_group_after_all_its_rewards_and_some_logprobs_landed_raises(policy, params):
    # Documented: once all rewards are known the group's sums are folded into the step's gradient
    # and cannot be removed exactly; deliver the remaining logprobs instead.
    batch = Batch.of([1.0, 0.0, 0.0])
    clear_grads(params)
    acc = StreamingGRPO(params)
    deliver(acc, batch, policy.score, [("logprob", "g0-t0"), *[("reward", t) for t in batch.groups["g0"]]])
    with pytest.raises(GroupError, match="cannot be aborted"):
        acc.abort_group("g0")
    deliver(acc, batch, policy.score, [("logprob", "g0-t1"), ("logprob", "g0-t2")])
    acc.finish()
    assert relative_error(grads_of(params), reference_gradient(params, batch, policy.score)) <= 1e-12


def test_aborting_an_unknown_group_raises_a_group_error(params):
    acc = StreamingGRPO(params)
    with pytest.raises(GroupError, match="not open"):
        acc.abort_group("nope")


# ----------------------------------------------------------------------------- num_groups
def test_finish_with_twice_the_group_count_halves_the_gradient(policy, params):
    batch = Batch.of([1.0, 0.0, 1.0], [0.2, 0.7], [3.0, 1.0, 2.0, 0.0])
    once, _ = stream(params, batch, policy.score)
    halved, report = stream(params, batch, policy.score, num_groups=6)
    assert report.num_groups == 6 and report.groups_folded == 3
    assert relative_error(halved, [g / 2 for g in once]) <= 1e-15
    assert relative_error(halved, reference_gradient(params, batch, policy.score, num_groups=6)) <= 1e-12


def test_finish_rejects_a_global_group_count_below_the_local_one(policy, params):
    batch = Batch.of([1.0, 0.0], [0.0, 1.0])
    clear_grads(params)
    acc = StreamingGRPO(params)
    deliver(acc, batch, policy.score, batch.events())
    with pytest.raises(GroupError, match="num_groups=1"):
        acc.finish(num_groups=1)
    acc.finish(num_groups=2)  # the failed call changed nothing
    assert relative_error(grads_of(params), reference_gradient(params, batch, policy.score)) <= 1e-12


# ----------------------------------------------------------------------------- .grad
def test_finish_adds_to_existing_grads_and_touches_no_other_tensors_grad(policy, params):
    batch = Batch.of([1.0, 0.0, 0.5])
    frozen_scale = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)  # not in params
    temperature = torch.tensor(0.9, dtype=torch.float64, requires_grad=True)  # an input leaf

    def score(tid):
        return policy.score(tid) * frozen_scale / temperature

    want = reference_gradient(params, batch, score)
    clear_grads(params)
    before = [torch.full_like(p, 0.25) for p in params]
    for p, g in zip(params, before):
        p.grad = g.clone()
    acc = StreamingGRPO(params)
    deliver(acc, batch, score, logprobs_then_rewards(batch))
    acc.finish()
    assert relative_error(grads_of(params), [b + w for b, w in zip(before, want)]) <= 1e-12
    assert frozen_scale.grad is None and temperature.grad is None


def test_parameters_without_a_gradient_path_get_zeros_and_the_rest_match(policy):
    unused = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    params = [*policy.parameters(), unused]
    batch = Batch.of([1.0, 0.0])
    got, _ = stream(params, batch, policy.score)
    assert relative_error(got, reference_gradient(params, batch, policy.score)) <= 1e-12
    assert bool((unused.grad == 0).all())


# ----------------------------------------------------------------------------- admission
def test_opening_more_than_max_open_groups_raises_and_changes_nothing(policy, params):
    batch = Batch.of([1.0, 0.0], [0.0, 1.0, 1.0], [2.0, 1.0])
    clear_grads(params)
    acc = StreamingGRPO(params, max_open_groups=2)
    acc.open_group("g0", batch.groups["g0"])
    acc.open_group("g1", batch.groups["g1"])
    deliver(acc, batch, policy.score, [("logprob", "g1-t0")])
    before = (acc.open_groups, acc.bytes_in_use)
    with pytest.raises(OpenGroupLimitError, match="max_open_groups=2"):
        acc.open_group("g2", batch.groups["g2"])
    assert (acc.open_groups, acc.bytes_in_use) == before
    rest = [e for e in batch.events() if not e[1].startswith("g2") and e != ("logprob", "g1-t0")]
    deliver(acc, batch, policy.score, rest)
    acc.open_group("g2", batch.groups["g2"])  # a slot is free now: the same group is admitted
    deliver(acc, batch, policy.score, [e for e in batch.events() if e[1].startswith("g2")])
    report = acc.finish()
    assert report.num_groups == 3
    assert relative_error(grads_of(params), reference_gradient(params, batch, policy.score)) <= 1e-12


def test_max_open_groups_below_one_is_rejected(params):
    with pytest.raises(ValueError, match="max_open_groups"):
        StreamingGRPO(params, max_open_groups=0)


# ----------------------------------------------------------------------------- bytes
@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_peak_bytes_count_every_buffer_for_a_scripted_event_order(offload):
    policy = MLPPolicy(torch.float32)
    params = list(policy.parameters())
    p4 = sum(p.numel() for p in params) * 4  # one float32 buffer of every parameter
    batch = Batch.of([0.0, 1.0, 2.0, 3.0], [1.0, 0.0])
    acc = StreamingGRPO(params, offload=offload)
    where = "device" if offload == "none" else "pageable_host"

    def usage():
        u = acc.bytes_in_use
        return {"group": getattr(u, where) - (u.device if where != "device" else 0), "device": u.device}

    deliver(acc, batch, policy.score, [("logprob", f"g0-t{i}") for i in range(4)])  # 4 held
    assert acc.bytes_in_use.total == 4 * p4
    deliver(acc, batch, policy.score, [("reward", "g0-t0"), ("reward", "g0-t1")])  # held -> 2 sums
    assert acc.bytes_in_use.total == 4 * p4
    # A third distinct reward collapses {r: sum} into (G1, G2): one new buffer, then two freed.
    deliver(acc, batch, policy.score, [("reward", "g0-t2")])
    assert acc.bytes_in_use.total == 3 * p4  # G1, G2 and one held gradient; peak 5 on the way
    deliver(acc, batch, policy.score, [("reward", "g0-t3")])  # folds: step gradient only
    assert acc.bytes_in_use.device == p4 and acc.bytes_in_use.total == p4
    deliver(acc, batch, policy.score, [("logprob", "g1-t0"), ("reward", "g1-t0")])
    deliver(acc, batch, policy.score, [("reward", "g1-t1"), ("logprob", "g1-t1")])  # direct
    assert acc.bytes_in_use.total == p4
    report = acc.finish()
    assert acc.bytes_in_use.total == 0
    if offload == "none":  # everything lives with the parameters
        assert (report.peak_bytes.device, report.peak_bytes.pageable_host) == (5 * p4, 0)
    else:  # group sums on the host, the step's gradient with the parameters
        assert (report.peak_bytes.device, report.peak_bytes.pageable_host) == (p4, 5 * p4)
    assert report.peak_bytes.pinned_host == 0
    assert report.peak_bytes == acc.peak_bytes


def test_binary_rewards_touch_one_buffer_per_reward_value(policy, params):
    # Binary rewards keep P = sum_{r=1} and Z = sum_{r=0}: two buffers however large the group.
    batch = Batch.of([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    last = [("reward", "g0-t7"), ("logprob", "g0-t7")]
    order = [(kind, f"g0-t{i}") for i in range(7) for kind in ("reward", "logprob")]
    acc = StreamingGRPO(params)
    deliver(acc, batch, policy.score, order)  # 7 trajectories with both events: nothing folded yet
    assert acc.bytes_in_use.total == 2 * buffer_bytes(params)
    deliver(acc, batch, policy.score, last)  # fold (step gradient + P + Z at peak), then direct
    acc.finish()
    assert acc.peak_bytes.total == 3 * buffer_bytes(params)


# ----------------------------------------------------------------------------- report
def test_the_report_lists_each_groups_reward_mean_and_population_std(policy, params):
    batch = Batch.of([1.0, 0.0, 0.0, 1.0], [2.0, 4.0, 9.0])
    _, report = stream(params, batch, policy.score, logprobs_then_rewards(batch))
    assert [(s.group_id, s.size) for s in report.groups] == [("g0", 4), ("g1", 3)]
    assert report.groups[0].reward_mean == 0.5 and report.groups[0].reward_std == 0.5
    assert report.groups[1].reward_mean == 5.0
    assert report.groups[1].reward_std == pytest.approx((26 / 3) ** 0.5, rel=1e-15)  # divide by G
    assert (report.groups_folded, report.groups_aborted, report.trajectories) == (2, 0, 7)
    assert report.backward_passes == 7


def test_reset_starts_a_new_step_with_nothing_carried_over(policy, params):
    batch = Batch.of([1.0, 0.0])
    clear_grads(params)
    acc = StreamingGRPO(params)
    deliver(acc, batch, policy.score, batch.events())
    acc.finish()
    first = grads_of(params)
    acc.reset()
    deliver(acc, batch, policy.score, batch.events())  # same ids are fine in a new step
    report = acc.finish()
    assert relative_error(grads_of(params), [2 * g for g in first]) <= 1e-15
    assert report.num_groups == 1 and report.trajectories == 2
