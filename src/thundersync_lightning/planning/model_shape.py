"""What the memory plan needs of a model: its parameter counts, weight size and dimensions.

:class:`Architecture` is read from a Hugging Face style config and gives the per-token
activation bytes of the plan's formula (:mod:`~thundersync_lightning.planning.memory_plan`'s
docstring); :class:`ModelShape` adds the parameter counts and what LoRA would train.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

__all__ = ["Architecture", "ModelShape"]


@dataclass(frozen=True, slots=True)
class Architecture:
    """The dimensions of a decoder-only transformer that the activation estimate needs."""

    layers: int
    hidden: int
    intermediate: int
    q_dim: int  # attention heads x head dim
    kv_dim: int  # key/value heads x head dim
    vocab: int
    max_positions: int | None = None

    @classmethod
    def of(cls, config: Any) -> Architecture | None:
        """From a Hugging Face style config (an object or a mapping); None when a field is missing."""
        if config is None:
            return None

        def get(name: str) -> Any:
            return config.get(name) if isinstance(config, Mapping) else getattr(config, name, None)

        hidden, layers, vocab = get("hidden_size"), get("num_hidden_layers"), get("vocab_size")
        heads = get("num_attention_heads")
        if not all(isinstance(v, int) and v > 0 for v in (hidden, layers, vocab, heads)):
            return None
        head_dim = get("head_dim") or hidden // heads
        kv_heads = get("num_key_value_heads") or heads
        return cls(
            layers=layers,
            hidden=hidden,
            intermediate=get("intermediate_size") or 4 * hidden,
            q_dim=heads * head_dim,
            kv_dim=kv_heads * head_dim,
            vocab=vocab,
            max_positions=get("max_position_embeddings"),
        )

    def layer_activation_bytes(self, e: int, frozen_down_proj: bool = False) -> int:
        """b_layer of the module docstring: bytes saved for backward per token per layer. A frozen
        ``down_proj`` (LoRA on the attention) does not save its input: a frozen linear's backward
        needs only its weight."""
        h, i, q, k = self.hidden, self.intermediate, self.q_dim, self.kv_dim
        norms = 2 * (4 + e) * h + (4 + e) * (q + k)
        attention = e * (q + 2 * k) + e * (2 * q + 2 * k)
        mlp = (3 if frozen_down_proj else 4) * e * i
        return norms + attention + mlp

    def logits_bytes(self, e: int, entropy: bool) -> int:
        """b_logits of the module docstring: logits, their fp32 copy and the temperature-scaled copy."""
        return self.vocab * (e + 8 + (8 if entropy else 0))

    def token_activation_bytes(self, e: int, entropy: bool, frozen_down_proj: bool = False) -> int:
        """Per token of a scored trajectory: every layer, the embeddings and final norm, the logits."""
        layers = self.layers * self.layer_activation_bytes(e, frozen_down_proj)
        return layers + (5 + 2 * e) * self.hidden + self.logits_bytes(e, entropy)

    def prefix_bytes_per_token(self, e: int) -> int:
        """Boundary-cut leaves per prompt token: every layer's keys and values."""
        return 2 * self.layers * self.kv_dim * e

    @property
    def lora_params_per_rank(self) -> int:
        """Adapter parameters per unit of rank on q/k/v/o_proj (LoraSettings' default targets)."""
        h, q, k = self.hidden, self.q_dim, self.kv_dim
        return self.layers * ((h + q) + 2 * (h + k) + (q + h))


@dataclass(frozen=True, slots=True)
class ModelShape:
    """What the plan needs of the model: parameter counts, the weights' element size, dimensions.

    ``lora_params_per_rank``: adapter parameters per unit of rank on the targets LoRA would use
    (0: unknown; the plan then cannot suggest LoRA). ``frozen_down_proj``: the MLP's ``down_proj``
    does not train (LoRA on other targets), so its input is not saved for backward.
    """

    total_params: int
    trainable_params: int
    param_bytes: int = 4
    architecture: Architecture | None = None
    lora: bool = False
    lora_params_per_rank: int = 0
    frozen_down_proj: bool = False

    def with_lora(self, rank: int, frozen_down_proj: bool = True) -> ModelShape:
        """The same model with LoRA adapters of ``rank`` (only they train; by default on the
        attention projections, which ``lora_params_per_rank`` counts: ``down_proj`` stays frozen)."""
        adapters = rank * self.lora_params_per_rank
        return replace(
            self,
            total_params=self.total_params + adapters,
            trainable_params=adapters,
            lora=True,
            frozen_down_proj=frozen_down_proj,
        )
