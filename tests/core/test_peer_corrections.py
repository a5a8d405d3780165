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

import pytest
import torch

from thundersync_lightning.core import Objective
from thundersync_lightning.core.terms import engine_logprobs
from thundersync_lightning.core.types import Segment, Trajectory

from .objective_helpers import Batch, Event, TokenPolicy, barrier, params_of, rel, streamed, synchronous
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


def _trl_gradient(policy: TokenPolicy, batch: Batch, weights, beta: float = 0.0, bias_correction: bool = True):
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
    terms = {k: trajectory_terms(Objective(kl_coef=1.0, kl_estimator=k), s, None) for k in ("k2", "k3", "k3_corrected")}
    assert torch.allclose(terms["k3_corrected"].independent, terms["k3"].independent, rtol=0, atol=1e-15)
    params = params_of(policy)
    g = {k: torch.autograd.grad(t.independent.sum(), params, retain_graph=True) for k, t in terms.items()}
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
        assert rel(barrier(policy, Objective.preset("trl", is_correction=mode, is_cap=2.0), TRL_BATCH), expected) > 1e-6


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
        is_correction=mode, loss_agg=agg, norm_tokens=5.0 if agg.endswith("norm") else None, kl_coef=0.1,
        entropy_coef=0.02,
    )
    reference, *others = _all_modes(policy, obj, TRL_BATCH)
    assert float(reference.norm()) > 0
    for got in others:
        assert rel(got, reference) <= 1e-12
    all_empty = Batch({"g": ("e-empty0", "e-empty1")}, {"e-empty0": 1.0, "e-empty1": 0.0}, {"e-empty0": False, "e-empty1": False})
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
