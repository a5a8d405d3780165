"""The ``verl`` and ``trl`` presets against our own written form of those libraries' losses.

Each reference below is written from the libraries' documented formulas at ratio 1 (one update
per batch, so PPO clipping is inert and the gradient of ratio = exp(l - l.detach()) is grad l):

- verl 0.9 GRPO: A = (r - mean_g) / (torch.std(r_g) + 1e-6), a group of one has mean 0 and std 1;
  policy loss per token -A * ratio; ``token-mean``: sum over every scored token of the batch
  divided by their number.
- TRL 1.16 GRPOTrainer: A = (r - mean_g) / (std_g(G-1) + 1e-4) (``scale_rewards="group"``), or
  divided by the std of all rewards (``"batch"``), or not divided (``"none"``); vLLM importance
  sampling ``sequence_mask``: w = exp(sum_t (l - e)) per sequence, set to 0 above the cap (3);
  per-token loss -A * ratio * w; ``dapo``: divided by the batch's scored tokens; ``dr_grpo``:
  divided by (sequences x max_completion_length).
"""

from __future__ import annotations

import torch

from thundersync_lightning.core import Objective

from ..objective_helpers import Batch, TokenPolicy, barrier, params_of, rel, streamed, synchronous

BATCH = Batch(
    {"g0": ("a0", "a1", "a2", "a3"), "g1": ("b0", "b1", "b2", "b3"), "g2": ("c0",), "g3": ("d0", "d1")},
    {
        "a0": 1.0,
        "a1": 0.0,
        "a2": 1.0,
        "a3": 0.5,
        "b0": 1.0,
        "b1": 1.0,
        "b2": 1.0,
        "b3": 1.0,
        "c0": 1.0,
        "d0": 0.0,
        "d1": 2.0,
    },
    {t: False for t in ("a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3", "c0", "d0", "d1")},
)


def _written(policy: TokenPolicy, batch: Batch, advantages: dict[str, float], weights, denominator: float):
    params = params_of(policy)
    tids = batch.order
    s = policy.scores(tids, entropy=False, reference=False)
    lp, m = s.logprobs, s.mask.to(s.logprobs.dtype)
    ratio = torch.exp(lp - lp.detach())
    adv = torch.tensor([advantages[t] for t in tids], dtype=lp.dtype)[:, None]
    w = weights(lp.detach(), policy.engine(tids, s), m)
    loss = (-adv * ratio * w * m).sum() / denominator(m)
    loss.backward()
    out = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return out


def _group_advantages(batch: Batch, eps: float, singleton_mean_zero: bool, std_of=None) -> dict[str, float]:
    out = {}
    for tids in batch.groups.values():
        r = torch.tensor([batch.rewards[t] for t in tids], dtype=torch.float64)
        if len(tids) == 1:
            mean, std = (0.0, 1.0) if singleton_mean_zero else (float("nan"), float("nan"))
        else:
            mean, std = float(r.mean()), float(torch.std(r))
        if std_of is not None:
            std = std_of
        for t, v in zip(tids, r.tolist()):
            out[t] = (v - mean) / (std + eps)
    return out


def _no_weights(lp, e, m):
    return torch.ones_like(lp)


def _tokens(m):
    return m.sum()


def test_the_verl_preset_is_verls_grpo_with_token_mean():
    policy = TokenPolicy(torch.float64, seed=3)
    adv = _group_advantages(BATCH, 1e-6, singleton_mean_zero=True)
    assert adv["c0"] == 1.0 / (1.0 + 1e-6)  # the singleton keeps its reward (verl: mean 0, std 1)
    assert all(adv[t] == 0.0 for t in BATCH.groups["g1"])  # all-equal rewards: exactly 0
    expected = _written(policy, BATCH, adv, _no_weights, _tokens)
    obj = Objective.preset("verl")
    assert rel(barrier(policy, obj, BATCH), expected) <= 1e-12
    assert rel(synchronous(policy, obj, BATCH), expected) <= 1e-12


def _sequence_mask(cap):
    def weights(lp, e, m):
        w = torch.exp(((lp - e) * m).sum(-1, keepdim=True)).expand_as(lp)
        return torch.where(w > cap, torch.zeros_like(w), w)

    return weights


def test_the_trl_preset_is_trls_grpo_with_dapo_and_sequence_mask_importance_sampling():
    policy = TokenPolicy(torch.float64, seed=4)
    batch = Batch(
        {g: ts for g, ts in BATCH.groups.items() if len(ts) > 1}, BATCH.rewards, BATCH.failed
    )  # G >= 2 in TRL
    adv = _group_advantages(batch, 1e-4, singleton_mean_zero=False)
    s = policy.scores(batch.order, entropy=False, reference=False)
    w = _sequence_mask(3.0)(s.logprobs.detach(), policy.engine(batch.order, s), s.mask.double())
    assert bool((w == 0).any()) and bool((w > 0).any())  # the cap really masks some sequences here
    expected = _written(policy, batch, adv, _sequence_mask(3.0), _tokens)
    obj = Objective.preset("trl")
    assert rel(barrier(policy, obj, batch), expected) <= 1e-12
    assert rel(synchronous(policy, obj, batch), expected) <= 1e-12


def test_trl_batch_scaling_divides_by_the_std_of_every_reward_of_the_step():
    policy = TokenPolicy(torch.float64, seed=5)
    batch = Batch({g: ts for g, ts in BATCH.groups.items() if len(ts) > 1}, BATCH.rewards, BATCH.failed)
    everything = torch.tensor([batch.rewards[t] for t in batch.order], dtype=torch.float64)
    adv = _group_advantages(batch, 1e-4, False, std_of=float(torch.std(everything)))
    expected = _written(policy, batch, adv, _sequence_mask(3.0), _tokens)
    obj = Objective.preset("trl", scale="batch")
    assert rel(barrier(policy, obj, batch), expected) <= 1e-12
    events_first_group_last = sorted(synchronous_events(batch), key=lambda e: (e.tid.startswith("a"), e.kind))
    assert rel(streamed(policy, obj, batch, events_first_group_last), expected) <= 1e-12


def test_trl_dr_grpo_divides_by_sequences_times_the_maximum_completion_length():
    policy = TokenPolicy(torch.float64, seed=6)
    batch = Batch({g: ts for g, ts in BATCH.groups.items() if len(ts) > 1}, BATCH.rewards, BATCH.failed)
    adv = {}
    for tids in batch.groups.values():
        r = torch.tensor([batch.rewards[t] for t in tids], dtype=torch.float64)
        adv.update({t: v - float(r.mean()) for t, v in zip(tids, r.tolist())})
    max_len = 16
    expected = _written(policy, batch, adv, _sequence_mask(3.0), lambda m: m.shape[0] * max_len)
    obj = Objective.preset(
        "trl", scale="none", loss_agg="seq-mean-token-sum-norm", norm_tokens=float(max_len)
    )
    assert rel(barrier(policy, obj, batch), expected) <= 1e-12


def synchronous_events(batch: Batch):
    from ..objective_helpers import Event

    return [Event("reward", t, batch.rewards[t]) for t in batch.order] + [
        Event("content", t) for t in batch.order
    ]
