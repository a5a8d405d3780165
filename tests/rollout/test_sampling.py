"""Inverse-CDF sampling with temperature and top-p."""

from __future__ import annotations

import torch

from thundersync_lightning.rollout import sample_from_logprobs, temperature_logprobs
from thundersync_lightning.rollout.sampling import make_generator, turn_seed


def test_sampled_frequencies_follow_the_temperature_scaled_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    lp = temperature_logprobs(logits, 0.5)
    gen = make_generator(0)
    n = 20000
    uniforms = torch.rand(n, generator=gen)
    tokens, _ = sample_from_logprobs(lp.expand(n, -1), uniforms)
    freq = torch.bincount(tokens, minlength=4).double() / n
    # softmax([4, 2, 0, -2]) = [0.867, 0.117, 0.016, 0.002]; 4 sigma of a binomial at n=20000 is < 0.01
    assert torch.allclose(freq, lp.exp()[0].double(), atol=0.01)


def test_top_p_never_samples_outside_the_nucleus_and_reports_the_truncated_distributions_logprobs():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    lp = temperature_logprobs(logits, 1.0)
    uniforms = torch.linspace(0, 0.999999, 1000)
    tokens, chosen = sample_from_logprobs(lp.expand(1000, -1), uniforms, top_p=0.8)
    assert set(tokens.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.8
    # sampled from {0: 0.5/0.8, 1: 0.3/0.8}: log(0.625) and log(0.375), as vLLM's processed_logprobs
    assert torch.allclose(chosen, torch.log(torch.tensor([0.625, 0.375]))[tokens])
    full, untruncated = sample_from_logprobs(lp.expand(1000, -1), uniforms, top_p=1.0)
    assert torch.allclose(untruncated, lp[0, full])


def test_a_draw_depends_only_on_its_row():
    lp = temperature_logprobs(torch.randn(5, 11, generator=make_generator(1)), 1.3)
    u = torch.rand(5, generator=make_generator(2))
    together, _ = sample_from_logprobs(lp, u, top_p=0.9)
    alone = [sample_from_logprobs(lp[i : i + 1], u[i : i + 1], top_p=0.9)[0].item() for i in range(5)]
    assert together.tolist() == alone


def test_turn_seeds_differ_across_turns_and_trajectories():
    seeds = {turn_seed(s, t) for s in range(50) for t in range(8)}
    assert len(seeds) == 400
