"""The streamed gradient equals the barrier reference, whatever the order events arrive in.

Hypothesis draws the batch (1..16 trajectories per group; binary, few-valued and continuous
rewards) and a random interleaving of reward and logprob events; the streamed ``.grad`` must equal
one backward of L = -(1/N) sum_g sum_i A_i S_i up to summation order: max relative error
<= 1e-5 in float32 and <= 1e-12 in float64.
"""

from __future__ import annotations

import statistics

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thundersync_lightning.core import ConfigError, StreamingGRPO, available_estimators

from ..helpers import (
    TOLERANCE,
    Batch,
    MLPPolicy,
    clear_grads,
    deliver,
    grads_of,
    qwen_policy,
    reference_gradient,
    reference_objective,
    relative_error,
    seed_of,
    stream,
)

BUILT_IN = available_estimators()  # every estimator registered when the tests are collected: the package's
OFFLOADS = ("none", "cpu", "pinned") if torch.cuda.is_available() else ("none", "cpu")
FEW_VALUES = (-1.0, 0.0, 0.25, 0.5, 2.0)
SETTINGS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


def _well_conditioned(rewards: list[float]) -> bool:
    """Spread at least a tenth of the magnitude (or all equal). Offset rewards whose spread is tiny
    are ill-conditioned for any affine-in-reward fold; their precision has its own test below."""
    spread = statistics.pstdev(rewards)
    return spread == 0.0 or spread >= 0.1 * max(abs(r) for r in rewards)


@st.composite
def group_rewards(draw, max_size: int = 16) -> list[float]:
    size = draw(st.integers(1, max_size))
    kind = draw(st.sampled_from(["binary", "few-valued", "continuous"]))
    if kind == "binary":
        return draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=size, max_size=size))
    if kind == "few-valued" and size >= 3:  # three distinct values or more: the collapse path
        distinct = draw(st.lists(st.sampled_from(FEW_VALUES), min_size=3, max_size=3, unique=True))
        rest = draw(st.lists(st.sampled_from(FEW_VALUES), min_size=size - 3, max_size=size - 3))
        return draw(st.permutations(distinct + rest))
    finite = st.floats(-1.0, 1.0, allow_nan=False, allow_subnormal=False)
    return draw(st.lists(finite, min_size=size, max_size=size).filter(_well_conditioned))


@st.composite
def batches_and_orders(draw, max_groups: int = 4, max_size: int = 16) -> tuple[Batch, list]:
    rewards = draw(st.lists(group_rewards(max_size), min_size=1, max_size=max_groups))
    batch = Batch.of(*rewards)
    order = draw(st.permutations(batch.events()))
    return batch, order


def _check_stream_equals_reference(policy, params, batch, order, estimator, offload, dtype):
    want = reference_gradient(params, batch, policy.score, estimator)
    got, report = stream(params, batch, policy.score, order, estimator=estimator, offload=offload)
    assert relative_error(got, want) <= TOLERANCE[dtype]
    assert report.groups_folded == report.num_groups == len(batch.groups)
    assert report.trajectories == len(batch.rewards)
    objective = reference_objective(batch, policy.score, estimator)
    assert report.objective == pytest.approx(objective, rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("offload", OFFLOADS)
@pytest.mark.parametrize("estimator", BUILT_IN)
@settings(max_examples=12, **SETTINGS)
@given(case=batches_and_orders())
def test_streamed_gradient_of_an_mlp_equals_the_barrier_reference(case, estimator, offload, dtype):
    batch, order = case
    policy = MLPPolicy(dtype)
    _check_stream_equals_reference(policy, list(policy.parameters()), batch, order, estimator, offload, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("offload", OFFLOADS)
@settings(max_examples=5, **SETTINGS)
@given(case=batches_and_orders(max_groups=3, max_size=8), estimator=st.sampled_from(BUILT_IN))
def test_streamed_gradient_of_a_tiny_qwen3_equals_the_barrier_reference(case, estimator, offload, dtype):
    batch, order = case
    policy = qwen_policy(dtype)
    params = policy.parameters()
    try:
        _check_stream_equals_reference(policy, params, batch, order, estimator, offload, dtype)
    finally:
        clear_grads(params)


def test_a_batch_with_every_group_size_from_one_to_sixteen_equals_the_reference():
    # Deterministic companion of the property tests: continuous rewards, logprobs before rewards.
    gen = torch.Generator().manual_seed(3)
    batch = Batch.of(*[torch.rand(g, generator=gen, dtype=torch.float64).tolist() for g in range(1, 17)])
    policy = MLPPolicy(torch.float64)
    params = list(policy.parameters())
    order = [e for e in batch.events() if e[0] == "logprob"] + [e for e in batch.events() if e[0] == "reward"]
    want = reference_gradient(params, batch, policy.score)
    got, report = stream(params, batch, policy.score, order)
    assert relative_error(got, want) <= 1e-12
    assert report.num_groups == 16 and report.trajectories == 136


@st.composite
def batches_with_aborts(draw) -> tuple[Batch, Batch, list, dict]:
    """A batch, the part of it that completes, an event order and, per aborted group, how many of
    its events land before ``abort_group``. An aborted group never receives one of its rewards
    (a failed rollout), so its abort is always legal."""
    batch, order = draw(batches_and_orders(max_groups=5, max_size=8))
    aborted = draw(st.lists(st.sampled_from(sorted(batch.groups)), unique=True, max_size=len(batch.groups)))
    order = list(order)
    cuts = {}
    for gid in aborted:
        missing = draw(st.sampled_from(batch.groups[gid]))
        order.remove(("reward", missing))
        delivered = sum(batch.group_of(t) == gid for _, t in order)
        cuts[gid] = draw(st.integers(0, delivered))
    return batch, batch.without(*aborted), order, cuts


@pytest.mark.parametrize("offload", OFFLOADS)
@settings(max_examples=25, **SETTINGS)
@given(case=batches_with_aborts(), estimator=st.sampled_from(BUILT_IN))
def test_aborted_groups_leave_nothing_behind(case, estimator, offload):
    batch, kept, order, cuts = case
    policy = MLPPolicy(torch.float64)
    params = list(policy.parameters())
    want = reference_gradient(params, kept, policy.score, estimator)

    clear_grads(params)
    acc = StreamingGRPO(params, estimator, offload=offload)
    seen = dict.fromkeys(cuts, 0)
    for event in order:
        gid = batch.group_of(event[1])
        if gid in cuts:
            if seen[gid] == cuts[gid]:
                continue
            seen[gid] += 1
        deliver(acc, batch, policy.score, [event])
        if gid in cuts and seen[gid] == cuts[gid]:
            acc.abort_group(gid)
    for gid, cut in cuts.items():
        if cut == 0:  # aborted before any event: declared, then dropped
            acc.open_group(gid, batch.groups[gid])
            acc.abort_group(gid)
    report = acc.finish()

    assert relative_error(grads_of(params), want) <= 1e-12
    assert report.groups_aborted == len(cuts)
    assert report.num_groups == report.groups_folded == len(kept.groups)
    assert report.trajectories == len(kept.rewards)
    assert acc.bytes_in_use.total == 0


def test_every_available_estimator_is_covered_by_the_property_tests():
    # every estimator registered now, those the tests register themselves ("test-..." names) aside,
    # is one the property tests above run over; the built-in three are among them
    registered = {n for n in available_estimators() if not n.startswith("test-") and ":" not in n}
    assert registered <= set(BUILT_IN)
    assert {"grpo", "drgrpo", "rloo"} <= set(BUILT_IN)


@pytest.mark.parametrize("offset", [10.0, 100.0])
def test_collapsed_group_sums_keep_float32_precision_when_rewards_share_a_large_offset(offset):
    # Four distinct rewards (the two-sum collapse path) with a common offset: mu/sigma ~ offset/0.075.
    # a*G1 + b*G2 cancels two terms of size |b| ~ mu/sigma; the reference weights each S_i by A_i.
    batch = Batch.of([offset, offset + 0.1, offset + 0.2, offset + 0.05])
    policy = MLPPolicy(torch.float32)
    params = list(policy.parameters())
    order = [e for e in batch.events() if e[0] == "logprob"] + [e for e in batch.events() if e[0] == "reward"]
    want = reference_gradient(params, batch, policy.score)
    got, _ = stream(params, batch, policy.score, order)
    assert relative_error(got, want) <= 1e-5


@pytest.mark.skipif(torch.cuda.is_available(), reason="pinned host memory is available on this build")
def test_pinned_offload_on_a_cpu_only_build_raises_a_config_error_that_suggests_cpu():
    params = list(MLPPolicy().parameters())
    with pytest.raises(ConfigError, match="offload='pinned'.*offload='cpu'"):
        StreamingGRPO(params, offload="pinned")


def test_an_unknown_offload_mode_raises_a_config_error_listing_the_valid_ones():
    params = list(MLPPolicy().parameters())
    with pytest.raises(ConfigError, match="'none', 'cpu', 'pinned'"):
        StreamingGRPO(params, offload="disk")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA parameters")
@pytest.mark.parametrize("offload", OFFLOADS)
def test_offloaded_sums_of_cuda_parameters_equal_the_reference(offload):
    # Large enough (4M parameters, 16 MB per buffer) that an unsynchronised device-to-host copy is
    # still in flight when the host reads the buffer it lands in.
    torch.manual_seed(0)
    head = torch.nn.Linear(256, 16384, device="cuda")
    params = list(head.parameters())
    inputs = {f"g{g}-t{i}": torch.randn(256, device="cuda") for g in range(3) for i in range(6)}

    def score(tid):
        return torch.log_softmax(head(inputs[tid]), dim=-1)[seed_of(tid) % 16384]

    batch = Batch.of(
        [1.0, 0.0, 1.0, 1.0, 0.0, 0.0], [0.5, 2.0, -1.0, 0.0, 0.5, 3.0], [1.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    )
    # Rewards of all but the last trajectory first, so each logprob lands in a sum at once.
    order = [e for t in batch.rewards for e in (("reward", t), ("logprob", t)) if not t.endswith("t5")]
    order += [e for e in batch.events() if e[1].endswith("t5")]
    want = reference_gradient(params, batch, score)
    got, _ = stream(params, batch, score, order, offload=offload)
    assert relative_error(got, want) <= 1e-5
