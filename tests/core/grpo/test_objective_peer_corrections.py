"""verl's and TRL's corrections beyond the presets, each against our own written form of the peer's
formula (fp64), streamed and synchronous alike.

Written from the peers' documented formulas at ratio 1 (one update per batch):

- TRL ``beta > 0``: per-token loss -A ratio w + beta k3 c, with k3 = exp(q - l) - (q - l) - 1 and
  c = exp(l - [l]) when ``use_bias_correction_kl=True`` (value 1, gradient grad l), c = 1 otherwise;
  the vLLM weight w multiplies the policy term only.
- TRL ``vllm_importance_sampling_clip_min``: ``*_truncate`` clamps the ratio to [min, max],
  ``*_mask`` zeroes a ratio outside it.
- An empty completion (no scored token) is a valid member of its group: its reward counts in the
  group's statistics, it adds nothing to the token count and its sequence-level ratio is exp(0).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from thundersync_lightning.core import Objective
from thundersync_lightning.core.grpo.terms import engine_logprobs
from thundersync_lightning.core.types import Segment, Trajectory

from ..objective_helpers import Batch, Event, TokenPolicy, barrier, params_of, rel, streamed, synchronous
from .test_objective import IS_MODES, LOSS_AGGS, _random_events

TRL_BATCH = Batch(
    {"g0": ("a0", "a1", "a2", "a3"), "g1": ("b0", "b1", "b-empty"), "g2": ("d0", "d1")},
    {"a0": 1.0, "a1": 0.0, "a2": 1.0, "a3": 0.5, "b0": 1.0, "b1": 0.0, "b-empty": 1.0, "d0": 0.0, "d1": 2.0},
    {t: False for t in ("a0", "a1", "a2", "a3", "b0", "b1", "b-empty", "d0", "d1")},
)


def _trl_advantages(batch: Batch, eps: float = 1e-4) -> dict[str, float]:
    out = {}
    for tids in batch.groups.values():
        r = torch.tensor([batch.rewards[t] for t in tids], dtype=torch.float64)
        mean, std = float(r.mean()), float(torch.std(r))
        out.update({t: (v - mean) / (std + eps) for t, v in zip(tids, r.tolist())})
    return out


def _trl_weights(mode: str, cap: float, low: float | None):
    def weights(lp, e, m):
        log_ratio = (lp - e) * m
        if mode.startswith("sequence"):
            ratio = torch.exp(log_ratio.sum(-1, keepdim=True)).expand_as(lp)
        else:
            ratio = torch.exp(log_ratio)
        if mode.endswith("truncate"):
            return torch.clamp(ratio, min=low, max=cap)
        bad = (ratio > cap) | (ratio < (low if low is not None else -float("inf")))
        return ratio.masked_fill(bad, 0.0)

    return weights


def _trl_gradient(
    policy: TokenPolicy, batch: Batch, weights, beta: float = 0.0, bias_correction: bool = True
):
    """TRL's ``dapo`` loss written out: sum over scored tokens / scored tokens of the batch."""
    params = params_of(policy)
    tids = batch.order
    s = policy.scores(tids, entropy=False, reference=True)
    lp, m = s.logprobs, s.mask.to(s.logprobs.dtype)
    adv = _trl_advantages(batch)
    a = torch.tensor([adv[t] for t in tids], dtype=lp.dtype)[:, None]
    ratio = torch.exp(lp - lp.detach())
    per_token = -a * ratio * weights(lp.detach(), policy.engine(tids, s), m)
    if beta:
        q = s.ref_logprobs
        kl = torch.exp(q - lp) - (q - lp) - 1
        per_token = per_token + beta * (kl * ratio if bias_correction else kl)
    ((per_token * m).sum() / m.sum()).backward()
    out = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return out


def _all_modes(policy: TokenPolicy, obj: Objective, batch: Batch) -> list[torch.Tensor]:
    return [
        barrier(policy, obj, batch),
        synchronous(policy, obj, batch),
        streamed(policy, obj, batch, _random_events(batch, 5), chunk=2),
    ]


def test_trl_beta_at_its_default_bias_correction_is_k3_corrected_and_differs_from_k3():
    policy = TokenPolicy(torch.float64, seed=8)
    expected = _trl_gradient(policy, TRL_BATCH, _trl_weights("sequence_mask", 3.0, None), beta=0.04)
    obj = Objective.preset("trl", kl_coef=0.04)
    assert obj.kl_estimator == "k3_corrected"
    for got in _all_modes(policy, obj, TRL_BATCH):
        assert rel(got, expected) <= 1e-12
    plain_k3 = barrier(policy, Objective.preset("trl", kl_coef=0.04, kl_estimator="k3"), TRL_BATCH)
    assert rel(plain_k3, expected) > 1e-6  # the learner is off the reference: the two really differ


def test_trl_beta_without_bias_correction_is_plain_k3():
    policy = TokenPolicy(torch.float64, seed=9)
    weights = _trl_weights("sequence_mask", 3.0, None)
    expected = _trl_gradient(policy, TRL_BATCH, weights, beta=0.04, bias_correction=False)
    obj = Objective.preset("trl", kl_coef=0.04, kl_estimator="k3")
    for got in _all_modes(policy, obj, TRL_BATCH):
        assert rel(got, expected) <= 1e-12


def test_k3_corrected_has_the_value_of_k3_and_the_gradient_of_k2():
    from thundersync_lightning.core import trajectory_terms

    policy = TokenPolicy(torch.float64, seed=10)
    tids = ["x0", "x1", "x2"]
    s = policy.scores(tids)
    terms = {
        k: trajectory_terms(Objective(kl_coef=1.0, kl_estimator=k), s, None)
        for k in ("k2", "k3", "k3_corrected")
    }
    assert torch.allclose(terms["k3_corrected"].regulariser, terms["k3"].regulariser, rtol=0, atol=1e-15)
    params = params_of(policy)
    g = {k: torch.autograd.grad(t.regulariser.sum(), params, retain_graph=True) for k, t in terms.items()}
    assert all(torch.allclose(a, b, rtol=1e-12, atol=1e-15) for a, b in zip(g["k3_corrected"], g["k2"]))
    assert not all(torch.allclose(a, b, rtol=1e-6) for a, b in zip(g["k3"], g["k2"]))


@pytest.mark.parametrize("mode", IS_MODES[1:])
@pytest.mark.parametrize("low", [None, 0.9])
def test_trl_importance_sampling_bounds_clamp_or_mask_in_every_mode(mode, low):
    policy = TokenPolicy(torch.float64, seed=11)
    expected = _trl_gradient(policy, TRL_BATCH, _trl_weights(mode, 2.0, low))
    obj = Objective.preset("trl", is_correction=mode, is_cap=2.0, is_min=low)
    for got in _all_modes(policy, obj, TRL_BATCH):
        assert rel(got, expected) <= 1e-12
    if low is not None:  # the lower bound really acts on this batch
        assert (
            rel(barrier(policy, Objective.preset("trl", is_correction=mode, is_cap=2.0), TRL_BATCH), expected)
            > 1e-6
        )


def test_an_empty_completion_under_the_trl_preset_gives_trls_gradient():
    policy = TokenPolicy(torch.float64, seed=12)
    expected = _trl_gradient(policy, TRL_BATCH, _trl_weights("sequence_mask", 3.0, None))
    for got in _all_modes(policy, Objective.preset("trl"), TRL_BATCH):
        assert rel(got, expected) <= 1e-12


@pytest.mark.parametrize("mode", IS_MODES)
@pytest.mark.parametrize("agg", LOSS_AGGS)
def test_an_empty_completion_is_valid_input_under_every_importance_correction(mode, agg):
    policy = TokenPolicy(torch.float64, seed=13)
    obj = Objective(
        is_correction=mode,
        loss_agg=agg,
        norm_tokens=5.0 if agg.endswith("norm") else None,
        kl_coef=0.1,
        entropy_coef=0.02,
    )
    reference, *others = _all_modes(policy, obj, TRL_BATCH)
    assert float(reference.norm()) > 0
    for got in others:
        assert rel(got, reference) <= 1e-12
    all_empty = Batch(
        {"g": ("e-empty0", "e-empty1")},
        {"e-empty0": 1.0, "e-empty1": 0.0},
        {"e-empty0": False, "e-empty1": False},
    )
    for got in _all_modes(policy, obj, all_empty):
        assert float(got.norm()) == 0.0


def _trajectory(tid: str, scored: tuple[int, ...], logprobs: tuple[float, ...] | None) -> Trajectory:
    segments = (Segment(scored, True, logprobs),) if scored else ()
    return Trajectory(tid, "g", 0, (1, 2), segments, 0, 1, "submit", 0.0, 0.0)


def test_engine_logprobs_of_a_batch_with_an_empty_completion_are_laid_out_not_dropped():
    batch = [_trajectory("t0", (3, 4), (-0.5, -1.5)), _trajectory("t1", (), None)]
    mask = torch.tensor([[False, True, True], [False, False, False]])
    got = engine_logprobs(batch, mask, torch.float64)
    assert got is not None
    assert got.tolist() == [[0.0, -0.5, -1.5], [0.0, 0.0, 0.0]]
    missing = [_trajectory("t0", (3, 4), None), _trajectory("t1", (), None)]
    assert engine_logprobs(missing, mask, torch.float64) is None  # scored tokens without logprobs: none


def test_is_min_outside_zero_to_is_cap_is_rejected():
    from thundersync_lightning.core import ConfigError

    with pytest.raises(ConfigError, match=r"is_min must be None or a number in \[0, is_cap=2.0\], got 3.0"):
        Objective(is_correction="token_mask", is_cap=2.0, is_min=3.0)


def test_streamed_events_with_empty_completions_arriving_first():
    policy = TokenPolicy(torch.float64, seed=14)
    obj = Objective.preset("trl", kl_coef=0.1)
    events = [Event("content", "b-empty"), Event("reward", "b-empty", 1.0)] + [
        e for e in _random_events(TRL_BATCH, 3) if e.tid != "b-empty"
    ]
    assert rel(streamed(policy, obj, TRL_BATCH, events), barrier(policy, obj, TRL_BATCH)) <= 1e-12


# ---------------------------------------------------------------- verl rollout rejection sampling

VERL_BATCH = Batch(
    {"g0": ("a0", "a1", "a2", "a3"), "g1": ("b0", "b1", "b-empty"), "g2": ("c0",), "g3": ("d0", "d1", "d2")},
    {
        "a0": 1.0,
        "a1": 0.0,
        "a2": 1.0,
        "a3": 0.5,
        "b0": 1.0,
        "b1": 0.0,
        "b-empty": 1.0,
        "c0": 1.0,
        "d0": 0.0,
        "d1": 2.0,
        "d2": 1.0,
    },
    {t: False for t in ("a0", "a1", "a2", "a3", "b0", "b1", "b-empty", "c0", "d0", "d1", "d2")},
)


def _verl_advantages(batch: Batch) -> dict[str, float]:
    out = {}
    for tids in batch.groups.values():
        r = [batch.rewards[t] for t in tids]
        if len(r) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(r) / len(r)
            std = (sum((v - mean) ** 2 for v in r) / (len(r) - 1)) ** 0.5
        out.update({t: (v - mean) / (std + 1e-6) for t, v in zip(tids, r)})
    return out


def _verl_keep(option: str, lo: float, hi: float, d: list[float]) -> list[bool]:
    """verl's rejection of one sequence, written per token with Python floats (d = learner - engine)."""
    import math

    k = {"k1": [-x for x in d], "k2": [x * x / 2 for x in d], "k3": [math.exp(x) - 1 - x for x in d]}[
        option[-2:]
    ]
    if option[-2:] == "k1":
        inside = lambda v: math.log(lo) <= v <= math.log(hi)  # noqa: E731
    else:
        inside = lambda v: v <= hi  # noqa: E731
    if option.startswith("token"):
        return [inside(v) for v in k]
    stat = {"seq_sum": sum(k), "seq_mean": sum(k) / max(len(k), 1), "seq_max": max(k, default=0.0)}[
        option[:-3]
    ]
    return [inside(stat)] * len(d)


def _verl_gradient(
    policy: TokenPolicy, batch: Batch, option: str, lo: float, hi: float, kl: float
) -> torch.Tensor:
    """verl's token-mean actor loss with the rejected tokens removed from the response mask."""
    params = params_of(policy)
    tids = batch.order
    s = policy.scores(tids, entropy=False, reference=True)
    lp, m = s.logprobs, s.mask.to(s.logprobs.dtype)
    e = policy.engine(tids, s)
    keep = torch.zeros_like(m)
    for i in range(len(tids)):
        n = int(m[i].sum())
        keep[i, :n] = torch.tensor(
            _verl_keep(option, lo, hi, (lp[i, :n].detach() - e[i, :n]).tolist()), dtype=m.dtype
        )
    adv = _verl_advantages(batch)
    a = torch.tensor([adv[t] for t in tids], dtype=lp.dtype)[:, None]
    q = s.ref_logprobs
    per_token = -a * torch.exp(lp - lp.detach()) + kl * (torch.exp(q - lp) - (q - lp) - 1)
    ((per_token * keep).sum() / keep.sum()).backward()
    out = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return out


@pytest.mark.parametrize(
    "option, threshold, lo, hi",
    [
        ("token_k1", "0.6_1.5", 0.6, 1.5),
        ("token_k1", 1.5, 1 / 1.5, 1.5),
        ("token_k2", 0.1, None, 0.1),
        ("token_k3", 0.1, None, 0.1),
        ("seq_sum_k1", "0.5_2.0", 0.5, 2.0),
        ("seq_sum_k2", 0.3, None, 0.3),
        ("seq_sum_k3", 0.3, None, 0.3),
        ("seq_mean_k1", 1.3, 1 / 1.3, 1.3),
        ("seq_mean_k2", 0.1, None, 0.1),
        ("seq_mean_k3", 0.1, None, 0.1),
        ("seq_max_k2", 0.2, None, 0.2),
        ("seq_max_k3", 0.2, None, 0.2),
    ],
)
def test_verl_rejection_sampling_options_remove_their_tokens_in_every_mode(option, threshold, lo, hi):
    policy = TokenPolicy(torch.float64, seed=15)
    expected = _verl_gradient(policy, VERL_BATCH, option, lo, hi, kl=0.1)
    obj = Objective.preset("verl", rs=option, rs_threshold=threshold, kl_coef=0.1)
    for got in _all_modes(policy, obj, VERL_BATCH):
        assert rel(got, expected) <= 1e-12
    unrejected = barrier(policy, Objective.preset("verl", kl_coef=0.1), VERL_BATCH)
    assert rel(unrejected, expected) > 1e-6  # the option really rejects something here


def test_several_rejection_options_must_all_pass():
    policy = TokenPolicy(torch.float64, seed=16)
    both = Objective.preset("verl", rs="token_k1,seq_max_k3", rs_threshold="0.6_1.5,0.2")
    one = Objective.preset("verl", rs="token_k1", rs_threshold="0.6_1.5")
    other = Objective.preset("verl", rs="seq_max_k3", rs_threshold=0.2)
    tids = VERL_BATCH.order
    s = policy.scores(tids)
    from thundersync_lightning.core import trajectory_terms

    e = policy.engine(tids, s)
    tokens = {
        name: trajectory_terms(o, s, e).tokens for name, o in (("both", both), ("one", one), ("other", other))
    }
    assert torch.equal(tokens["both"], torch.minimum(tokens["one"], tokens["other"]) * (tokens["other"] > 0))
    assert (
        rel(
            streamed(policy, both, VERL_BATCH, _random_events(VERL_BATCH, 2)),
            barrier(policy, both, VERL_BATCH),
        )
        <= 1e-12
    )


@pytest.mark.parametrize(
    "fields, match",
    [
        ({"rs": "token_k4", "rs_threshold": 1.0}, "rs='token_k4': options must be comma-separated names"),
        ({"rs": "token_k1"}, "needs rs_threshold"),
        ({"rs": "token_k2", "rs_threshold": "0.1_0.2"}, "is not a number"),
        ({"rs": "token_k1", "rs_threshold": "2.0_1.0"}, "lo must be <= hi"),
        ({"rs": "token_k1,token_k2", "rs_threshold": "1,2,3"}, "one threshold or one per option"),
        ({"rs_threshold": 1.0}, "only used with rs"),
    ],
)
def test_bad_rejection_settings_are_rejected(fields, match):
    from thundersync_lightning.core import ConfigError

    with pytest.raises(ConfigError, match=match):
        Objective(**fields)


# ---------------------------------------------------------------- overlong filtering

LONG_BATCH = Batch(
    {"g0": ("a0", "a-long1", "a2", "a3"), "g1": ("b0", "b-long1", "b-empty")},
    {"a0": 1.0, "a-long1": 0.0, "a2": 1.0, "a3": 0.5, "b0": 0.0, "b-long1": 1.0, "b-empty": 1.0},
    {t: False for t in ("a0", "a-long1", "a2", "a3", "b0", "b-long1", "b-empty")},
)


@pytest.mark.parametrize("loss_type", ["dapo", "grpo"])
def test_trl_mask_truncated_completions_is_overlong_filter(loss_type):
    """TRL zeroes a truncated completion's mask after its advantages were computed from every reward."""
    policy = TokenPolicy(torch.float64, seed=17)
    params = params_of(policy)
    tids = LONG_BATCH.order
    s = policy.scores(tids, entropy=True, reference=False)
    lp, m = s.logprobs, s.mask.to(s.logprobs.dtype) * (~s.truncated).to(s.logprobs.dtype)[:, None]
    adv = _trl_advantages(LONG_BATCH)
    a = torch.tensor([adv[t] for t in tids], dtype=lp.dtype)[:, None]
    per_token = (
        -a
        * torch.exp(lp - lp.detach())
        * _trl_weights("sequence_mask", 3.0, None)(lp.detach(), policy.engine(tids, s), m)
    )
    if loss_type == "dapo":  # with TRL's entropy bonus, a token mean for dapo
        loss = (per_token * m).sum() / m.sum() - 0.03 * (s.entropy * m).sum() / m.sum()
        obj = Objective.preset("trl", overlong_filter=True, entropy_coef=0.03)
    else:
        loss = ((per_token * m).sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
        obj = Objective.preset("trl", overlong_filter=True, loss_agg="seq-mean-token-mean")
    loss.backward()
    expected = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    for got in _all_modes(policy, obj, LONG_BATCH):
        assert rel(got, expected) <= 1e-12
    assert rel(barrier(policy, replace(obj, overlong_filter=False), LONG_BATCH), expected) > 1e-6


def test_overlong_filter_without_truncation_flags_raises():
    from thundersync_lightning.core import InvalidLogprobError, trajectory_terms

    policy = TokenPolicy(torch.float64)
    s = replace(policy.scores(["a0"]), truncated=None)
    with pytest.raises(
        InvalidLogprobError, match="overlong_filter needs to know which trajectories hit the length"
    ):
        trajectory_terms(Objective(overlong_filter=True), s, None)


# ---------------------------------------------------------------- verl rollout_is_batch_normalize


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("kl", [0.0, 0.1])
def test_verl_batch_normalized_importance_weights_in_every_mode(level, kl):
    """verl: w = min(exp(d), cap) (d summed over the sequence for ``sequence``), divided by the batch
    mean of w (over scored tokens, or over non-empty sequences), multiplying the policy term only.
    verl adds 1e-8 to a masked mean's count; written here without it."""
    policy = TokenPolicy(torch.float64, seed=18)
    params = params_of(policy)
    tids = VERL_BATCH.order
    s = policy.scores(tids, entropy=False, reference=True)
    lp, m = s.logprobs, s.mask.to(s.logprobs.dtype)
    d = (lp.detach() - policy.engine(tids, s)) * m
    if level == "token":
        w = torch.exp(d).clamp(max=2.0) * m
        mean = w.sum() / m.sum()
    else:
        seq = torch.exp(d.sum(-1)).clamp(max=2.0)  # (n,)
        nonempty = (m.sum(-1) > 0).to(lp.dtype)
        mean = (seq * nonempty).sum() / nonempty.sum()
        w = seq[:, None] * m
    adv = _verl_advantages(VERL_BATCH)
    a = torch.tensor([adv[t] for t in tids], dtype=lp.dtype)[:, None]
    q = s.ref_logprobs
    per_token = -a * torch.exp(lp - lp.detach()) * (w / mean) + kl * (torch.exp(q - lp) - (q - lp) - 1)
    ((per_token * m).sum() / m.sum()).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    obj = Objective.preset(
        "verl", is_correction=f"{level}_truncate", is_cap=2.0, is_batch_normalize=True, kl_coef=kl
    )
    for got in _all_modes(policy, obj, VERL_BATCH):
        assert rel(got, expected) <= 1e-12
    assert rel(barrier(policy, replace(obj, is_batch_normalize=False), VERL_BATCH), expected) > 1e-6


def test_is_batch_normalize_needs_importance_weights():
    from thundersync_lightning.core import ConfigError

    with pytest.raises(ConfigError, match="is_batch_normalize needs importance weights: set is_correction"):
        Objective(is_batch_normalize=True)


# ---------------------------------------------------------------- TRL top_entropy_quantile


@pytest.mark.parametrize("quantile", [0.2, 0.5])
def test_trl_top_entropy_quantile_with_kl_and_entropy_bonus(quantile):
    """TRL: the policy term (and the entropy bonus) only on tokens whose entropy is at least the
    (1 - q)-quantile of the batch's; KL and the dapo normaliser keep every token."""
    from thundersync_lightning.core import StreamingGRPO, trajectory_terms
    from thundersync_lightning.core.grpo.terms import entropy_threshold

    policy = TokenPolicy(torch.float64, seed=19)
    params = params_of(policy)
    tids = TRL_BATCH.order
    s = policy.scores(tids)
    lp, m = s.logprobs, s.mask.to(s.logprobs.dtype)
    thr = torch.quantile(s.entropy.detach()[s.mask], 1 - quantile)
    em = ((s.entropy.detach() * m) >= thr).to(lp.dtype) * m
    adv = _trl_advantages(TRL_BATCH)
    a = torch.tensor([adv[t] for t in tids], dtype=lp.dtype)[:, None]
    w = _trl_weights("sequence_mask", 3.0, None)(lp.detach(), policy.engine(tids, s), m)
    q = s.ref_logprobs
    ratio = torch.exp(lp - lp.detach())
    per_token = -a * ratio * em * w + 0.04 * (torch.exp(q - lp) - (q - lp) - 1) * ratio
    loss = (per_token * m).sum() / m.sum() - 0.03 * (s.entropy * em).sum() / m.sum()
    loss.backward()
    expected = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    obj = Objective.preset("trl", kl_coef=0.04, entropy_coef=0.03, top_entropy_quantile=quantile)
    assert entropy_threshold(quantile, [s.entropy[s.mask]]) == pytest.approx(float(thr), abs=0)
    acc = StreamingGRPO(params, objective=obj)
    for gid, ts in TRL_BATCH.groups.items():
        acc.open_group(gid, ts)
    for t in tids:  # every verdict first (sync), then the scored batch in two calls
        acc.add_reward(t, TRL_BATCH.rewards[t])
    for part in (tids[:4], tids[4:]):
        scores = replace(policy.scores(part), entropy_threshold=float(thr))
        acc.add_tokens(part, scores, policy.engine(part, scores))
    acc.finish()
    got = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    assert rel(got, expected) <= 1e-12
    with pytest.raises(
        Exception, match="top_entropy_quantile < 1 needs per-token entropies and the step's entropy"
    ):
        trajectory_terms(obj, s, policy.engine(tids, s))


# ---------------------------------------------------------------- TRL off_policy_mask_threshold


@pytest.mark.parametrize("delta", [0.0, 0.1])
@pytest.mark.parametrize("chunk", [1, 3])
def test_trl_off_policy_sequence_mask_in_every_mode_and_event_order(delta, chunk):
    """TRL: keep a sequence's policy term if A >= 0 or mean_t (e - l) <= delta; KL is never masked."""
    policy = TokenPolicy(torch.float64, seed=20)
    params = params_of(policy)
    tids = TRL_BATCH.order
    s = policy.scores(tids, entropy=False, reference=True)
    lp, m = s.logprobs, s.mask.to(s.logprobs.dtype)
    e = policy.engine(tids, s)
    adv = _trl_advantages(TRL_BATCH)
    a = torch.tensor([adv[t] for t in tids], dtype=lp.dtype)[:, None]
    kl_seq = ((e - lp.detach()) * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
    keep = ((a >= 0) | (kl_seq <= delta)).to(lp.dtype)
    assert bool((keep == 0).any())  # some flagged sequence with a negative advantage really is masked
    q = s.ref_logprobs
    ratio = torch.exp(lp - lp.detach())
    w = _trl_weights("sequence_mask", 3.0, None)(lp.detach(), e, m)
    per_token = -a * ratio * keep * w + 0.04 * (torch.exp(q - lp) - (q - lp) - 1) * ratio
    ((per_token * m).sum() / m.sum()).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    obj = Objective.preset("trl", kl_coef=0.04, off_policy_mask=delta)
    assert rel(barrier(policy, obj, TRL_BATCH), expected) <= 1e-12
    assert rel(synchronous(policy, obj, TRL_BATCH), expected) <= 1e-12
    for seed in range(4):
        assert (
            rel(streamed(policy, obj, TRL_BATCH, _random_events(TRL_BATCH, seed), chunk), expected) <= 1e-12
        )
