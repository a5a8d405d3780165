"""What the agent loop asks of a generator and gets back: the seam both engines fill (embedded: a
Hugging Face model, :mod:`...embedded.generator`; vLLM: its step loop)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["GenerationRequest", "Generation", "GenerateFn"]


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """Continue ``prefix`` by at most ``max_new_tokens`` tokens, sampling with ``seed``.

    Generation stops after emitting ``stop_token`` (included in the output) when it is set.
    """

    prefix: tuple[int, ...]
    seed: int
    max_new_tokens: int
    stop_token: int | None = None


@dataclass(frozen=True, slots=True)
class Generation:
    """Sampled tokens and their logprobs (one per token; see ``rollout.sampling``)."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]


GenerateFn = Callable[[Sequence[GenerationRequest]], Sequence[Generation]]
"""Batched generation: one :class:`Generation` per request, in the same order. It must be a
pure function of (prefix, seed, weights): the same request gives the same tokens whatever else is
in the batch."""
