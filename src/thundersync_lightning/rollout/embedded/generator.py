"""Batched KV-cache generation for Hugging Face causal LMs, with our own sampling loop.

Prefixes of different lengths are left-padded; position ids are computed from the attention
mask (``cumsum - 1``) so every row sees exactly the positions it would see unpadded, and its
logits match the learner's unpadded forward up to float rounding. The prefix is run once
(prefill) into a ``DynamicCache``; each further token is one forward of shape (B, 1).

Each row samples with its own ``torch.Generator`` seeded from the request's seed and draws one
uniform per token (see :mod:`.sampling`), so its tokens do not depend on the other rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from transformers import DynamicCache

from ..agent.loop import Generation, GenerationRequest
from ..hf_model import cache_kwarg
from ..sampling import make_generator, sample_from_logprobs, temperature_logprobs

__all__ = ["HFGenerator"]


class HFGenerator:
    """A :data:`~..agent.loop.GenerateFn` over a Hugging Face causal LM.

    Args:
        model: a ``transformers`` causal LM (its weights are read at call time).
        temperature: sampling temperature T > 0 (logprobs are ``log_softmax(z / T)``).
        top_p: nucleus mass in (0, 1].
        pad_token: id placed in padding slots (masked out; any valid id works).
        max_batch_size: rows per forward; larger calls are split (each row is independent).
    """

    def __init__(
        self,
        model: Any,
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        pad_token: int = 0,
        max_batch_size: int = 256,
    ) -> None:
        self.model = model
        self.temperature = temperature
        self.top_p = top_p
        self.pad_token = pad_token
        self.max_batch_size = max_batch_size

    def __call__(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        out: list[Generation] = []
        for start in range(0, len(requests), self.max_batch_size):
            out.extend(self._generate(requests[start : start + self.max_batch_size]))
        return out

    @torch.inference_mode()
    def _generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        if not requests:
            return []
        device = next(self.model.parameters()).device
        batch = len(requests)
        lengths = [len(r.prefix) for r in requests]
        if min(lengths) == 0:
            raise ValueError(
                "generation needs a non-empty prefix (an environment's reset() returned no tokens)"
            )
        width = max(lengths)
        input_ids = torch.full((batch, width), self.pad_token, dtype=torch.long)  # (B, L)
        mask = torch.zeros((batch, width), dtype=torch.long)  # (B, L)
        for row, req in enumerate(requests):
            input_ids[row, width - lengths[row] :] = torch.tensor(req.prefix, dtype=torch.long)
            mask[row, width - lengths[row] :] = 1
        positions = (mask.cumsum(-1) - 1).clamp_(min=0)  # (B, L)
        input_ids, mask, positions = input_ids.to(device), mask.to(device), positions.to(device)

        generators = [make_generator(r.seed) for r in requests]
        limits = [r.max_new_tokens for r in requests]
        stops = [r.stop_token for r in requests]
        tokens: list[list[int]] = [[] for _ in requests]
        logprobs: list[list[float]] = [[] for _ in requests]
        active = [lim > 0 for lim in limits]

        cache = {cache_kwarg(self.model): DynamicCache(config=self.model.config)}
        logits = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
            **cache,
        ).logits[:, -1]  # (B, V)
        last_pos = positions[:, -1:]  # (B, 1)
        for _ in range(max(limits)):
            if not any(active):
                break
            uniforms = torch.stack([torch.rand((), generator=g) for g in generators])  # (B,)
            lp = temperature_logprobs(logits, self.temperature)  # (B, V)
            next_tok, next_lp = sample_from_logprobs(lp, uniforms.to(lp.device), self.top_p)  # (B,), (B,)
            next_tok_cpu, next_lp_cpu = next_tok.tolist(), next_lp.tolist()
            for row in range(batch):
                if not active[row]:
                    continue
                tokens[row].append(int(next_tok_cpu[row]))
                logprobs[row].append(float(next_lp_cpu[row]))
                if len(tokens[row]) >= limits[row] or (
                    stops[row] is not None and next_tok_cpu[row] == stops[row]
                ):
                    active[row] = False
            if not any(active):
                break
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=-1)  # (B, L+k)
            last_pos = last_pos + 1
            logits = self.model(
                input_ids=next_tok.unsqueeze(-1),
                attention_mask=mask,
                position_ids=last_pos,
                use_cache=True,
                **cache,
            ).logits[:, -1]
        return [Generation(tuple(t), tuple(lp)) for t, lp in zip(tokens, logprobs)]
