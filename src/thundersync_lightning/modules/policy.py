"""``GRPOPolicy``: a Hugging Face causal LM as a LightningModule the strategy can stream.

Notation: trajectory i is tokens x_1..x_T with a scored mask m_t (policy-generated tokens);
the score is

    S_i = sum_t w_t * m_t * log softmax(z_{t-1} / T)[x_t]

with z the logits, T the sampling temperature (the engine reports logprobs of the same
temperature-scaled distribution, so S_i matches the sampler) and w_t = 1 (``token_weighting="sum"``)
or 1/|scored| (``"mean"``). The GRPO loss of a complete batch of N groups is
L = -(1/N) sum_g sum_i A_i S_i. :meth:`trajectory_logprobs` is the one hook the strategy calls;
:meth:`training_step` computes L itself so the module also trains under stock strategies.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule
from torch import Tensor
from typing_extensions import override

from ..core.estimators import advantages
from ..core.types import ModelSpec, Trajectory
from ..rollout.models import build_model
from ..strategy.plan import RolloutPlan
from .collect import collect_batch
from .lora import LoraSettings, apply_lora, merged_state_dict

__all__ = ["GRPOPolicy", "TINY_QWEN3"]

#: A tiny random Qwen3 (head_dim 64 so vLLM accepts it too); the toy task overrides vocab_size.
TINY_QWEN3: dict[str, Any] = {
    "vocab_size": 32,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 512,
    "tie_word_embeddings": True,
}


class GRPOPolicy(LightningModule):
    """A causal LM policy trained by GRPO.

    Args:
        model_type: a transformers model type (random init from ``config``; no download).
        config: keyword arguments of that model's config (default: a tiny Qwen3).
        pretrained_path: a local directory to load instead (``from_pretrained``, offline).
        dtype: parameter dtype.
        lr, weight_decay, betas: AdamW.
        temperature: sampling temperature (the score uses the same one).
        token_weighting: ``sum`` or ``mean`` over scored tokens.
        estimator, eps: the advantage estimator used by :meth:`training_step` (stock strategies).
        lora: optional LoRA settings (peft); then only adapters train.
        score_batch_tokens: padded-token budget of one forward in :meth:`trajectory_logprobs`;
            trajectories are sorted by length and packed into micro-batches under it, so a large
            batch (the synchronous baseline) wastes no compute on padding and bounds activations.
    """

    def __init__(
        self,
        model_type: str = "qwen3",
        config: Mapping[str, Any] | None = None,
        pretrained_path: str | None = None,
        dtype: str = "float32",
        lr: float = 3e-3,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        temperature: float = 1.0,
        token_weighting: Literal["sum", "mean"] = "sum",
        estimator: str = "grpo",
        eps: float = 1e-6,
        lora: LoraSettings | None = None,
        score_batch_tokens: int = 8192,
    ) -> None:
        super().__init__()
        if score_batch_tokens < 1:
            raise ValueError(f"score_batch_tokens must be >= 1, got {score_batch_tokens}")
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if token_weighting not in ("sum", "mean"):
            raise ValueError(f"token_weighting must be 'sum' or 'mean', got {token_weighting!r}")
        self.save_hyperparameters()
        self._spec = ModelSpec(
            model_type=model_type,
            config=dict(TINY_QWEN3 if config is None else config),
            pretrained_path=pretrained_path,
            dtype=dtype,
        )
        model = build_model(self._spec).train()
        self.model = apply_lora(model, lora) if lora is not None else model

    @property
    def model_spec(self) -> ModelSpec:
        """How engines build their own copy of this architecture."""
        return self._spec

    def weights_for_engine(self) -> dict[str, Tensor]:
        """Hugging Face names -> weights (LoRA merged), sharing storage where nothing is merged."""
        if self.hparams.lora is not None:
            return merged_state_dict(self.model)
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    # ------------------------------------------------------------------ scores and loss
    def trajectory_logprobs(self, trajectories: Sequence[Trajectory]) -> Tensor:
        """S_i for each trajectory, shape (n,), with a graph to the trainable parameters.

        Trajectories are scored in length-sorted micro-batches of at most ``score_batch_tokens``
        padded tokens; the result is in the order given.
        """
        order = sorted(range(len(trajectories)), key=lambda i: len(trajectories[i].tokens))
        budget = self.hparams.score_batch_tokens
        chunks: list[list[int]] = []
        for i in order:  # ascending lengths: the last member of a chunk is its longest
            if chunks and (len(chunks[-1]) + 1) * len(trajectories[i].tokens) <= budget:
                chunks[-1].append(i)
            else:
                chunks.append([i])
        scores = [self._score_padded([trajectories[i] for i in chunk]) for chunk in chunks]
        flat = torch.cat(scores)
        inverse = torch.empty(len(order), dtype=torch.long)
        inverse[torch.tensor([i for chunk in chunks for i in chunk])] = torch.arange(len(order))
        return flat[inverse.to(flat.device)]

    def _score_padded(self, trajectories: Sequence[Trajectory]) -> Tensor:
        """One right-padded forward over ``trajectories``: (n,) scores."""
        n = len(trajectories)
        length = max(len(t.tokens) for t in trajectories)
        ids = torch.zeros((n, length), dtype=torch.long)
        attention = torch.zeros((n, length), dtype=torch.long)
        scored = torch.zeros((n, length), dtype=torch.float32)
        for row, t in enumerate(trajectories):
            tokens = t.tokens
            ids[row, : len(tokens)] = torch.tensor(tokens)
            attention[row, : len(tokens)] = 1
            scored[row, : len(tokens)] = torch.tensor(t.scored_mask, dtype=torch.float32)
        ids, attention, scored = ids.to(self.device), attention.to(self.device), scored.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=attention).logits  # (n, L, V)
        z = logits[:, :-1]  # predicts tokens 1..L-1
        z = z.to(torch.promote_types(z.dtype, torch.float32)) / self.hparams.temperature
        target = ids[:, 1:]
        token_logprobs = z.gather(-1, target.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)  # (n, L-1)
        weights = scored[:, 1:]
        if self.hparams.token_weighting == "mean":
            weights = weights / weights.sum(-1, keepdim=True).clamp_min(1.0)
        return (token_logprobs * weights).sum(-1)

    def grpo_loss(
        self,
        trajectories: Sequence[Trajectory],
        rewards: Sequence[float],
        num_groups: int,
        estimator: str | None = None,
        eps: float | None = None,
    ) -> Tensor:
        """L = -(1/N) sum_g sum_i A_i S_i over a complete batch (one forward, one backward)."""
        estimator = estimator or self.hparams.estimator
        eps = self.hparams.eps if eps is None else eps
        by_group: dict[str, list[int]] = {}
        for i, t in enumerate(trajectories):
            by_group.setdefault(t.group_id, []).append(i)
        adv = torch.zeros(len(trajectories), dtype=torch.float64)
        for members in by_group.values():
            adv[members] = advantages([rewards[i] for i in members], estimator, eps)
        scores = self.trajectory_logprobs(trajectories)
        return -(adv.to(scores.device, scores.dtype) * scores).sum() / max(num_groups, 1)

    @override
    def training_step(self, batch: RolloutPlan, batch_idx: int) -> Tensor:
        """Synchronous GRPO under any stock strategy: publish, wait for the whole batch, one loss."""
        trajectories, rewards = collect_batch(
            batch, self.global_step, self.weights_for_engine(), self.global_rank, self.trainer.world_size
        )
        return self.grpo_loss(trajectories, rewards, len({t.group_id for t in trajectories}))

    @override
    def configure_optimizers(self) -> torch.optim.Optimizer:
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.AdamW(
            params, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay, betas=tuple(self.hparams.betas)
        )
