"""A failure never beats a graded answer, an unscorable member trains nothing, and no finite reward
makes a step NaN: the failure floor, TRL's unscorable rule and reward bounds, in float64."""

from __future__ import annotations

import math

import pytest
import torch

from thundersync_lightning.core import Objective, StreamingGRPO
from thundersync_lightning.core.errors import ConfigError, InvalidRewardError, NonFiniteAdvantageError
from thundersync_lightning.core.grpo.estimators import grpo_coefficients

from ..objective_helpers import Batch, Event, TokenPolicy, barrier, params_of, rel, streamed, synchronous

PENALTIES = {"exact": 0.0, "wrong": -1.0, "worse": -2.0, "crash": 0.0}


def _penalty_batch(failed: str = "crash") -> Batch:
    tids = tuple(PENALTIES)
    return Batch({"g": tids}, dict(PENALTIES), {t: t == failed for t in tids})


def _events(batch: Batch, order: list[str]) -> list[Event]:
    """Rewards in ``order`` interleaved with each trajectory's content right after its reward."""
    out = []
    for t in order:
        out.append(Event("content", t))
        out.append(Event("reward", t, batch.rewards[t], batch.failed[t], batch.unscorable.get(t, False)))
    return out


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_a_failure_among_penalties_scores_the_worst_graded_reward_not_the_best(estimator):
    obj = Objective(estimator=estimator)
    scored = obj.scored_rewards(list(PENALTIES.values()), [t == "crash" for t in PENALTIES])
    assert scored == [0.0, -1.0, -2.0, -2.0]  # the crash trained as 0.0 before: the exact answer's score
    adv = dict(zip(PENALTIES, obj.advantages(torch.tensor(scored, dtype=torch.float64)).tolist()))
    assert adv["crash"] == adv["worse"] < adv["wrong"] < adv["exact"]


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_a_streamed_failure_trains_exactly_as_the_worst_graded_reward_in_any_order(estimator):
    obj = Objective(estimator=estimator, kl_coef=0.1, loss_agg="token-mean")
    batch = _penalty_batch()
    as_worst = Batch(batch.groups, {**batch.rewards, "crash": -2.0}, {t: False for t in batch.rewards})
    policy = TokenPolicy(torch.float64, seed=4)
    reference = barrier(policy, obj, as_worst)
    assert rel(barrier(policy, obj, batch), reference) <= 1e-12
    assert rel(synchronous(policy, obj, batch), reference) <= 1e-12
    for order in (
        ["crash", "exact", "wrong", "worse"],
        ["exact", "crash", "worse", "wrong"],
        list(PENALTIES),
    ):
        assert rel(streamed(policy, obj, batch, _events(batch, order)), reference) <= 1e-12, order


def test_a_configured_failure_reward_is_known_at_once_and_nothing_is_held():
    obj = Objective(failure_reward=-10.0)
    batch = _penalty_batch()
    policy = TokenPolicy(torch.float64, seed=5)
    reference = barrier(
        policy, obj, Batch(batch.groups, {**batch.rewards, "crash": -10.0}, {t: False for t in batch.rewards})
    )
    params = params_of(policy)
    acc = StreamingGRPO(params, objective=obj, max_held_trajectories=0)
    acc.open_group("g", batch.groups["g"])
    acc.add_reward("crash", 0.0, failed=True)
    scores = policy.scores(["crash"], False, False)
    acc.add_tokens(["crash"], scores)  # its reward is known: the bound of no held gradient holds
    assert acc.held_trajectories == 0
    for t in ("exact", "wrong", "worse"):
        acc.add_reward(t, batch.rewards[t])
        acc.add_tokens([t], policy.scores([t], False, False))
    acc.finish()
    got = torch.cat([p.grad.reshape(-1) for p in params])
    assert rel(got, reference) <= 1e-12


def test_a_graded_reward_below_the_configured_failure_reward_is_refused_by_name():
    acc = StreamingGRPO(params_of(TokenPolicy()), objective=Objective(failure_reward=-1.0))
    acc.open_group("g", ["a", "b"])
    with pytest.raises(
        InvalidRewardError, match="below Objective.failure_reward=-1.0: a failure would outscore it"
    ):
        acc.add_reward("a", -3.0)


def test_a_group_of_failures_alone_has_every_advantage_zero():
    obj = Objective(kl_coef=0.1)
    batch = Batch({"g": ("a", "b", "c")}, {"a": 0.0, "b": 0.0, "c": 0.0}, {"a": True, "b": True, "c": True})
    policy = TokenPolicy(torch.float64, seed=6)
    regulariser_only = Objective(kl_coef=0.1, reward_coef=0.0)
    expected = barrier(
        policy, regulariser_only, Batch(batch.groups, batch.rewards, {t: False for t in "abc"})
    )
    assert rel(streamed(policy, obj, batch, _events(batch, ["a", "b", "c"])), expected) <= 1e-12


def test_failed_zero_is_refused_with_the_reason_and_the_replacement(caplog):
    with pytest.raises(ConfigError, match="failed='zero' is gone: a failure trained as 0.0 outscored"):
        Objective(failed="zero")
    old_checkpoint = {**Objective().to_dict(), "failed": "zero"}  # hparams written before the floor
    assert Objective.of(old_checkpoint) == Objective()
    assert "is read as failed='floor'" in caplog.text
    with pytest.raises(ConfigError, match="failure_reward=-5 is beyond max_abs_reward=2"):
        Objective(failure_reward=-5, max_abs_reward=2)


# ----------------------------------------------------------------------------- unscorable (TRL's None)
def _trl_advantages(rewards: list[float | None], std_correction: int, eps: float) -> list[float]:
    """TRL 1.16's arithmetic (grpo_trainer.py, ``_generate_and_score_completions``): None -> NaN,
    nanmean and nanstd (Bessel) over the group, nan_to_num(0) after."""
    r = torch.tensor([math.nan if x is None else x for x in rewards], dtype=torch.float64)
    mean = torch.nanmean(r)
    count = int((~torch.isnan(r)).sum())
    var = torch.nanmean((r - mean) ** 2) * (count / (count - std_correction))
    return torch.nan_to_num((r - mean) / (var.sqrt() + eps), nan=0.0).tolist()


def test_an_unscorable_completion_leaves_the_group_statistics_with_advantage_zero_as_in_trl():
    obj = Objective.preset("trl")
    rewards = {"a": 1.0, "b": 0.0, "c": None, "d": 0.5}
    expected = _trl_advantages(list(rewards.values()), 1, 1e-4)
    kept = [r for r in rewards.values() if r is not None]
    a, b = obj.coefficients(torch.tensor(kept, dtype=torch.float64))
    got = [0.0 if r is None else a * r + b for r in rewards.values()]
    assert got == pytest.approx(expected, rel=1e-12, abs=1e-15)
    assert expected[2] == 0.0


@pytest.mark.parametrize("estimator", ["grpo", "drgrpo", "rloo"])
def test_an_unscorable_member_still_counts_in_the_normaliser_and_trains_its_kl_term(estimator):
    obj = Objective(estimator=estimator, kl_coef=0.2, loss_agg="token-mean", std="sample")
    tids = ("a", "b", "c", "d")
    batch = Batch(
        {"g": tids}, {"a": 1.0, "b": 0.0, "c": 0.0, "d": 0.5}, {t: False for t in tids}, {"c": True}
    )
    policy = TokenPolicy(torch.float64, seed=8)
    # by hand: the reward term over a, b, d alone (their statistics), plus c's KL term, over every token
    without_c = Batch({"g": ("a", "b", "d")}, batch.rewards, batch.failed)
    s_abd = policy.scores(["a", "b", "d"])
    s_c = policy.scores(["c"])
    tokens = float(s_abd.mask.sum() + s_c.mask.sum())
    reward_part = barrier(
        policy, Objective(estimator=estimator, loss_agg="token-mean", std="sample"), without_c
    )
    reward_part = reward_part * float(s_abd.mask.sum()) / tokens
    kl_only = Objective(kl_coef=0.2, loss_agg="token-mean", reward_coef=0.0)
    kl_part = barrier(policy, kl_only, batch)  # KL of all four over all their tokens
    expected = reward_part + kl_part
    assert rel(barrier(policy, obj, batch), expected) <= 1e-12
    for order in (["c", "a", "b", "d"], ["a", "b", "d", "c"]):
        assert rel(streamed(policy, obj, batch, _events(batch, order)), expected) <= 1e-12


def test_the_report_counts_unscorable_members():
    policy = TokenPolicy()
    acc = StreamingGRPO(params_of(policy), objective=Objective())
    acc.open_group("g", ["a", "b", "c"])
    for t, r in (("a", 1.0), ("b", 0.0)):
        acc.add_reward(t, r)
    acc.add_reward("c", 0.0, unscorable=True)
    acc.add_tokens(["a", "b", "c"], policy.scores(["a", "b", "c"], False, False))
    report = acc.finish()
    assert report.unscorable == 1
    assert report.groups[0].unscorable == 1 and report.groups[0].size == 3
    assert report.groups[0].reward_mean == 0.5  # c is out of the statistics


# ----------------------------------------------------------------------------- bounds and overflow
def test_group_statistics_on_scaled_rewards_are_bit_identical_where_nothing_overflows():
    for values in ([0.0, 1.0, 0.25, 3.0], [1e5, 3e5, -2.5e5], [0.1, 0.7, 0.3]):
        r = torch.tensor(values, dtype=torch.float64)
        for correction in (0, 1):
            mu, sigma = float(r.mean()), float(r.std(correction=correction))
            naive = (1.0 / (sigma + 1e-6), -mu / (sigma + 1e-6))
            assert grpo_coefficients(r, 1e-6, correction=correction) == naive  # exact, not approx


def test_rewards_of_1e308_of_both_signs_give_finite_statistics_and_no_nan_parameter_after_sgd():
    obj = Objective(max_abs_reward=math.inf)
    r = torch.tensor([-1e308, 1e308, 1e308, -1.7e308, 0.5], dtype=torch.float64)
    a, b = obj.coefficients(r)
    assert all(math.isfinite(v) for v in (a, b)) and all(math.isfinite(a * x + b) for x in r.tolist())
    for dtype in (torch.float64, torch.float32):
        policy = TokenPolicy(dtype, seed=2)
        params = params_of(policy)
        acc = StreamingGRPO(params, objective=obj)
        tids = [f"t{i}" for i in range(len(r))]
        acc.open_group("g", tids)
        for t in tids:  # content first: five held gradients, then three distinct rewards collapse the sums
            acc.add_tokens([t], policy.scores([t], False, False))
        for t, x in zip(tids, r.tolist()):
            acc.add_reward(t, x)
        acc.finish()
        torch.optim.SGD(params, lr=0.1).step()
        assert all(bool(torch.isfinite(p).all()) for p in params), dtype


def test_an_advantage_that_overflows_is_a_clear_error_not_a_nan_step():
    obj = Objective(estimator="drgrpo", max_abs_reward=math.inf)
    with pytest.raises(NonFiniteAdvantageError, match="advantage of a group with rewards in"):
        obj.coefficients(torch.tensor([-1.7e308, 1.7e308, 1.7e308], dtype=torch.float64))  # r - mu < -1.8e308


def test_a_gradient_that_overflows_its_dtype_raises_before_any_grad_is_written():
    policy = TokenPolicy(torch.float32, seed=1)
    params = params_of(policy)
    acc = StreamingGRPO(params, objective=Objective(estimator="drgrpo", max_abs_reward=math.inf))
    acc.open_group("g", ["a", "b"])
    acc.add_reward("a", 0.0)
    acc.add_reward("b", 1e300)  # A = +-5e299: beyond float32
    acc.add_tokens(["a", "b"], policy.scores(["a", "b"], False, False))
    with pytest.raises(NonFiniteAdvantageError, match="non-finite entries .* no .grad was written"):
        acc.finish()
    assert all(p.grad is None for p in params)


def test_a_reward_beyond_max_abs_reward_is_refused_by_the_accumulator():
    acc = StreamingGRPO(params_of(TokenPolicy()), objective=Objective())
    acc.open_group("g", ["a", "b"])
    with pytest.raises(InvalidRewardError, match=r"reward -1e\+308 is beyond max_abs_reward=1e\+06"):
        acc.add_reward("a", -1e308)
    assert Objective(max_abs_reward=10.0).refused_reward(-10.0) is None
