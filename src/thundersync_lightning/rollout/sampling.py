"""Token sampling with reproducible per-trajectory randomness and learner-matching logprobs.

Notation:
    z      logits of the next token, shape (B, V)
    T      temperature (> 0)
    p      top-p mass (0 < p <= 1)
    u      one uniform draw in [0, 1) per row, from that row's own ``torch.Generator``

The reported logprob of a sampled token y is the log-probability under the
temperature-scaled distribution, BEFORE top-p truncation:

    logprob(y) = log_softmax(z / T)[y]          (computed in float32)

which is exactly what a learner gets from its own forward of the same weights when it applies
the same temperature: ``log_softmax(model(x).logits.float() / T).gather(-1, y)``. Top-p only
restricts which tokens may be drawn; it does not change the reported number.

Sampling is inverse-CDF on the probabilities sorted in descending order (stable sort: ties
broken by token id): keep the smallest prefix whose mass reaches p, renormalise, and take the
first token whose cumulative mass exceeds ``u * kept_mass``. Each row consumes exactly one draw
of its own generator per token, so a trajectory's tokens depend only on its seed and its
context, never on which other rows share the batch or in which order trajectories complete.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

__all__ = ["temperature_logprobs", "sample_from_logprobs", "turn_seed", "make_generator"]


def turn_seed(trajectory_seed: int, turn: int) -> int:
    """Seed of one turn's sampling: a hash of (trajectory seed, turn), 31 bits."""
    digest = hashlib.blake2b(f"turn/{trajectory_seed}/{turn}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF


def make_generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed`` (the draws are tiny; keep them off the accelerator)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    return gen


def temperature_logprobs(logits: Tensor, temperature: float) -> Tensor:
    """``log_softmax(z / T)`` in float32, shape (B, V) -> (B, V)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return torch.log_softmax(logits.float() / temperature, dim=-1)


def sample_from_logprobs(logprobs: Tensor, uniforms: Tensor, top_p: float = 1.0) -> tuple[Tensor, Tensor]:
    """Draw one token per row by inverse CDF under top-p truncation.

    Args:
        logprobs: (B, V) temperature-scaled log-probabilities (see :func:`temperature_logprobs`).
        uniforms: (B,) draws in [0, 1), one per row.
        top_p: kept probability mass, 0 < top_p <= 1.

    Returns:
        tokens (B,) int64 and their logprobs (B,) float32 under the distribution actually sampled:
        with ``top_p < 1`` the truncated, renormalised one, log(p_y / kept mass) (as vLLM's
        ``processed_logprobs``), so the learner's importance correction and on-policy check see
        the truncation.
    """
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    probs = logprobs.exp()  # (B, V)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # (B, V)
    if top_p < 1.0:
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs  # (B, V)
        sorted_probs = torch.where(mass_before < top_p, sorted_probs, torch.zeros_like(sorted_probs))
    cdf = torch.cumsum(sorted_probs, dim=-1)  # (B, V)
    target = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]  # (B, 1)
    pos = torch.searchsorted(cdf, target, right=True).clamp_(max=cdf.shape[-1] - 1)  # (B, 1)
    # Never land on a zero-probability (truncated) slot because of float rounding at the end.
    kept = (sorted_probs > 0).sum(dim=-1, keepdim=True) - 1
    pos = torch.minimum(pos, kept)
    tokens = order.gather(-1, pos).squeeze(-1)  # (B,)
    chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # (B,)
    if top_p < 1.0:
        chosen = chosen - torch.log(cdf[:, -1]).to(chosen.dtype)
    return tokens, chosen
