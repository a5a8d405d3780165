"""Every objective setting: streamed == synchronous == the barrier reference, in any event order."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from thundersync_lightning.core import ConfigError, Objective

from ..objective_helpers import Batch, Event, TokenPolicy, barrier, rel, streamed, synchronous

LOSS_AGGS = [
    "group-sum",
    "seq-mean-token-sum",
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
]
IS_MODES = ["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


def _objective(est, std, scale, agg, single, failed, kl, ent, is_mode, kl_est, opd, reward, is_min, rs, long,
               norm, opm, floor) -> Objective:  # fmt: skip
    return Objective(
        estimator=est,
        std=std,
        scale=scale,
        loss_agg=agg,
        norm_tokens=7.0 if agg == "seq-mean-token-sum-norm" else None,
        singleton=single,
        failed=failed,
        kl_coef=kl,
        entropy_coef=ent,
        is_correction=is_mode,
        is_cap=2.0,
        is_min=is_min,
        rs=rs[0],
        rs_threshold=rs[1],
        overlong_filter=long,
        is_batch_normalize=norm and is_mode != "none",
        off_policy_mask=opm,
        kl_estimator=kl_est,
        opd_coef=opd,
        reward_coef=reward,
        failure_reward=floor,
    )


objectives = st.builds(
    _objective,
    st.sampled_from(["grpo", "drgrpo", "rloo"]),
    st.sampled_from(["population", "sample"]),
    st.sampled_from(["group", "batch", "none"]),
    st.sampled_from(LOSS_AGGS),
    st.sampled_from(["zero", "reward"]),
    st.sampled_from(["floor", "drop"]),
    st.sampled_from([0.0, 0.3]),
    st.sampled_from([0.0, 0.05]),
    st.sampled_from(IS_MODES),
    st.sampled_from(["k1", "k2", "k3", "k3_corrected"]),
    st.sampled_from([0.0, 0.5]),
    st.sampled_from([1.0, 1.0, 0.7, 0.0]),
    st.sampled_from([None, 0.7]),
    st.sampled_from([(None, None), ("token_k1", "0.6_1.5"), ("seq_mean_k3,token_k2", "0.1,0.3")]),
    st.booleans(),
    st.booleans(),
    st.sampled_from([None, None, 0.05]),
    st.sampled_from(
        [None, None, -5.0]
    ),  # failure_reward: the worst graded reward of the group, or a constant
)


@st.composite
def batches(draw) -> Batch:
    n_groups = draw(st.integers(1, 4))
    groups, rewards, failed, unscorable = {}, {}, {}, {}
    for g in range(n_groups):
        size = draw(st.integers(1, 4))
        tids = tuple(
            f"b{draw(st.integers(0, 10**6))}-g{g}-t{k}"
            + draw(st.sampled_from(["", "", "", "-long", "-empty"]))
            for k in range(size)
        )
        equal = draw(st.booleans())
        base = draw(st.sampled_from([0.0, 1.0, 0.5]))
        for t in tids:
            rewards[t] = base if equal else draw(st.sampled_from([0.0, 1.0, 0.25, 3.0, -1.0, -2.0]))
            failed[t] = draw(st.integers(0, 5)) == 0
            unscorable[t] = not failed[t] and draw(st.integers(0, 6)) == 0
            if failed[t] or unscorable[t]:
                rewards[t] = 0.0
        groups[f"g{g}"] = tids
    return Batch(groups, rewards, failed, unscorable)


def _random_events(batch: Batch, seed: int) -> list[Event]:
    events = [
        Event("reward", t, batch.rewards[t], batch.failed[t], batch.unscorable.get(t, False))
        for t in batch.order
    ]
    events += [Event("content", t) for t in batch.order]
    random.Random(seed).shuffle(events)
    return events


@settings(max_examples=60, deadline=None)
@given(obj=objectives, batch=batches(), seed=st.integers(0, 2**16), chunk=st.integers(1, 3))
def test_streamed_equals_synchronous_equals_the_barrier_reference_in_fp64(obj, batch, seed, chunk):
    policy = TokenPolicy(torch.float64, seed=seed % 7)
    reference = barrier(policy, obj, batch)
    assert rel(synchronous(policy, obj, batch), reference) <= 1e-12 or float(reference.norm()) == 0.0
    got = streamed(policy, obj, batch, _random_events(batch, seed), chunk)
    if float(reference.norm()) == 0.0:
        assert float(got.norm()) == 0.0
    else:
        assert rel(got, reference) <= 1e-12


@settings(max_examples=25, deadline=None)
@given(obj=objectives, batch=batches(), seed=st.integers(0, 2**16))
def test_streamed_equals_the_barrier_reference_in_fp32(obj, batch, seed):
    policy = TokenPolicy(torch.float32, seed=seed % 5)
    reference = barrier(policy, obj, batch)
    got = streamed(policy, obj, batch, _random_events(batch, seed))
    if float(reference.norm()) < 1e-6:
        assert float(got.norm()) < 1e-5
    else:
        assert rel(got, reference) <= 1e-5


def test_every_setting_changes_the_gradient_somewhere():
    """No option is accepted and ignored: each non-default value moves the gradient of a fixed batch."""
    batch = Batch(
        {"g0": ("a0", "a1", "a2"), "g1": ("b0", "b1"), "g2": ("c0",)},
        {"a0": 1.0, "a1": 0.0, "a2": 0.25, "b0": 1.0, "b1": 3.0, "c0": 1.0},
        {"a0": False, "a1": True, "a2": False, "b0": False, "b1": False, "c0": False},
    )
    policy = TokenPolicy(torch.float64, seed=1)
    base = barrier(policy, Objective(), batch)
    variants = {
        "estimator": Objective(estimator="rloo"),
        "std": Objective(std="sample"),
        "eps": Objective(eps=0.5),
        "scale=batch": Objective(scale="batch"),
        "scale=none": Objective(scale="none"),
        **{
            f"loss_agg={a}": Objective(loss_agg=a, norm_tokens=3.0 if a.endswith("norm") else None)
            for a in LOSS_AGGS[1:]
        },
        "singleton": Objective(singleton="reward"),
        "kl_coef": Objective(kl_coef=0.2),
        "entropy_coef": Objective(entropy_coef=0.2),
        **{f"is={m}": Objective(is_correction=m, is_cap=1.5) for m in IS_MODES[1:]},
        **{f"is_min/{m}": Objective(is_correction=m, is_cap=1.5, is_min=0.9) for m in IS_MODES[1:]},
        "rs": Objective(rs="token_k2", rs_threshold=0.05),
        "off_policy_mask": Objective(off_policy_mask=0.0),
        "is_batch_normalize": Objective(is_correction="token_truncate", is_cap=1.5, is_batch_normalize=True),
        "failed": Objective(failed="drop"),
        "failure_reward": Objective(failure_reward=-1.0),
        "opd_coef": Objective(opd_coef=0.3),
        "reward_coef": Objective(reward_coef=0.5),
    }
    for name, obj in variants.items():
        assert rel(barrier(policy, obj, batch), base) > 1e-6, name
    k_grads = [barrier(policy, Objective(kl_coef=0.2, kl_estimator=k), batch) for k in ("k1", "k2", "k3")]
    assert rel(k_grads[0], k_grads[1]) > 1e-6 and rel(k_grads[1], k_grads[2]) > 1e-6
    corrected = barrier(policy, Objective(kl_coef=0.2, kl_estimator="k3_corrected"), batch)
    assert rel(corrected, k_grads[1]) <= 1e-12  # k2's gradient (its value is k3's)


def test_a_group_whose_kept_members_all_failed_counts_nowhere():
    obj = Objective(failed="drop", loss_agg="group-sum")
    batch = Batch(
        {"g0": ("a0", "a1"), "g1": ("b0", "b1")},
        {"a0": 0.0, "a1": 0.0, "b0": 1.0, "b1": 0.0},
        {"a0": True, "a1": True, "b0": False, "b1": False},
    )
    policy = TokenPolicy(torch.float64)
    alone = Batch({"g1": ("b0", "b1")}, {"b0": 1.0, "b1": 0.0}, {"b0": False, "b1": False})
    assert rel(barrier(policy, obj, batch), barrier(policy, obj, alone)) <= 1e-12
    assert rel(synchronous(policy, obj, batch), barrier(policy, obj, alone)) <= 1e-12


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"estimator": "ppo"}, "unknown advantage estimator 'ppo'; valid names"),
        ({"loss_agg": "seq-sum"}, "loss_agg='seq-sum' is not one of"),
        ({"loss_agg": "seq-mean-token-sum-norm"}, "needs norm_tokens > 0"),
        ({"norm_tokens": 5.0}, "norm_tokens is only used by"),
        ({"is_correction": "tokens"}, "is_correction='tokens' is not one of"),
        ({"kl_coef": -1.0}, "kl_coef must be a finite number >= 0"),
        (
            {"opd_coef": -0.1, "reward_coef": float("nan")},
            "opd_coef must be a finite.*reward_coef must be a finite",
        ),
        ({"std": "unbiased", "failed": "skip"}, "std='unbiased'.*failed='skip'"),
    ],
)
def test_bad_objective_fields_are_rejected_with_every_problem(fields, match):
    with pytest.raises(ConfigError, match=match):
        Objective(**fields)


def test_presets_and_mappings_build_objectives_and_unknown_names_are_rejected():
    assert Objective.preset("thundersync") == Objective()
    assert Objective.of("verl") == Objective.preset("verl")
    assert Objective.of({"preset": "trl", "kl_coef": 0.1}).kl_coef == 0.1
    assert Objective.of({"preset": "trl", "kl_coef": 0.1}).is_correction == "sequence_mask"
    with pytest.raises(
        ConfigError, match="unknown objective preset 'openrlhf'; valid presets: thundersync, verl, trl"
    ):
        Objective.preset("openrlhf")
    with pytest.raises(ConfigError, match=r"unknown Objective field\(s\) \['beta'\]"):
        Objective.of({"beta": 0.1})


# the full product of settings (~20 s); test_objective_checks_modes covers each option per mode
@pytest.mark.slow
def test_every_estimator_aggregation_std_scale_singleton_and_failure_setting_streams_exactly():
    """The full product of the advantage and normalisation settings, with KL, entropy, OPD and IS on."""
    import itertools

    batch = Batch(
        {"g0": ("a0", "a1", "a2"), "g1": ("b0", "b1"), "g2": ("c0",), "g3": ("d0", "d1")},
        {"a0": 1.0, "a1": 0.0, "a2": 0.25, "b0": 1.0, "b1": 1.0, "c0": 1.0, "d0": 0.0, "d1": 3.0},
        {
            "a0": False,
            "a1": False,
            "a2": True,
            "b0": False,
            "b1": False,
            "c0": False,
            "d0": True,
            "d1": False,
        },
    )
    policy = TokenPolicy(torch.float64, seed=2)
    events = _random_events(batch, 11)
    product = itertools.product(
        ["grpo", "drgrpo", "rloo"],
        LOSS_AGGS,
        ["population", "sample"],
        ["group", "batch", "none"],
        ["zero", "reward"],
        ["floor", "drop"],
    )
    for est, agg, std, scale, single, failed in product:
        obj = Objective(
            estimator=est,
            loss_agg=agg,
            std=std,
            scale=scale,
            singleton=single,
            failed=failed,
            norm_tokens=4.0 if agg.endswith("norm") else None,
            kl_coef=0.1,
            entropy_coef=0.02,
            is_correction="token_mask",
            is_cap=2.0,
            opd_coef=0.2,
        )
        reference = barrier(policy, obj, batch)
        assert rel(streamed(policy, obj, batch, events), reference) <= 1e-12, obj
