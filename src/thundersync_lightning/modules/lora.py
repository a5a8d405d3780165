"""Optional LoRA through peft, and merged weights for rollout engines.

With LoRA the trainable parameters are the adapters only, so the streaming accumulator holds
2 x P_adapter floats per open group instead of 2 x P. Engines still generate with full weights:
W = W_base + (alpha / r) B A, computed without touching the base weights in place (an in-place
merge would trip the policy snapshot's version guard).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

__all__ = ["LoraSettings", "apply_lora", "merged_state_dict"]


@dataclass(frozen=True)
class LoraSettings:
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = field(default=("q_proj", "k_proj", "v_proj", "o_proj"))


def apply_lora(model: nn.Module, settings: LoraSettings) -> nn.Module:
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=list(settings.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Hugging Face names -> tensors with every LoRA delta merged (base names, no adapters)."""
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        if "lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = value.detach()
    with torch.no_grad():
        for name, module in base.named_modules():
            if isinstance(module, LoraLayer) and module.active_adapters:
                weight = f"{name}.weight"
                delta = sum(module.get_delta_weight(a) for a in module.active_adapters)
                out[weight] = out[weight] + delta.to(out[weight].dtype)
    return out
