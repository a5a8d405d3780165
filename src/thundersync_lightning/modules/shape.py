"""A policy's :class:`~thundersync_lightning.planning.model_shape.ModelShape` without building its weights.

The architecture is instantiated on PyTorch's ``meta`` device (shapes, no storage), so planning a
32B model costs nothing: parameter counts are exact for any ``transformers`` causal LM, and the
LoRA count is r x (in + out) summed over the target linear layers.

``pretrained_path`` is read for its ``config.json``. Where that directory is not on this machine
(planning a GPU run from a laptop), a directory named like one of :data:`QWEN3_ARCHITECTURES`
(``/models/Qwen3-8B``) is planned with that published architecture, and the plan says so.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import torch

from ..core.errors import ConfigError
from ..core.types import ModelSpec
from ..planning.model_shape import Architecture, ModelShape
from .lora import LoraSettings

__all__ = ["QWEN3_ARCHITECTURES", "model_shape", "hf_config"]

log = logging.getLogger(__name__)

_QWEN3_COMMON = {
    "vocab_size": 151936,
    "head_dim": 128,
    "num_key_value_heads": 8,
    "max_position_embeddings": 40960,
}
#: Published Qwen3 configurations (Hugging Face ``config.json``), keyed by model directory name.
QWEN3_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "Qwen3-0.6B": {
        **_QWEN3_COMMON,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    },
    "Qwen3-1.7B": {
        **_QWEN3_COMMON,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "tie_word_embeddings": True,
    },
    "Qwen3-8B": {
        **_QWEN3_COMMON,
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "tie_word_embeddings": False,
    },
    "Qwen3-32B": {
        **_QWEN3_COMMON,
        "hidden_size": 5120,
        "intermediate_size": 25600,
        "num_hidden_layers": 64,
        "num_attention_heads": 64,
        "tie_word_embeddings": False,
    },
}


def hf_config(spec: ModelSpec) -> Any:
    """The ``transformers`` config of ``spec`` (a local ``pretrained_path``, or a known name)."""
    from transformers import AutoConfig

    path = spec.pretrained_path
    if path is None:
        return AutoConfig.for_model(spec.model_type, **dict(spec.config))
    if os.path.isdir(path):
        return AutoConfig.from_pretrained(path, local_files_only=True)
    name = os.path.basename(os.path.normpath(path))
    if name in QWEN3_ARCHITECTURES:
        log.info("%s is not on this machine: planning the published %s architecture", path, name)
        return AutoConfig.for_model("qwen3", **QWEN3_ARCHITECTURES[name])
    raise ConfigError(
        f"model.pretrained_path={path!r} is not a directory on this machine and not a known architecture "
        f"({', '.join(QWEN3_ARCHITECTURES)}); plan where the model is, or name "
        "the directory after one of those"
    )


def _lora_per_rank(model: torch.nn.Module, targets: tuple[str, ...]) -> int:
    """Adapter parameters per unit of rank: sum of (in + out) over the targeted linear layers."""
    return sum(
        m.in_features + m.out_features
        for name, m in model.named_modules()
        if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in targets
    )


def model_shape(
    spec: ModelSpec, lora: LoraSettings | Mapping[str, Any] | None = None, param_bytes: int | None = None
) -> ModelShape:
    """Exact parameter counts of ``spec`` (with ``lora`` adapters), weights of ``param_bytes`` each
    (default: ``spec.dtype``'s size)."""
    from transformers import AutoModelForCausalLM

    config = hf_config(spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    settings = LoraSettings(**lora) if isinstance(lora, Mapping) else lora
    targets = settings.target_modules if settings is not None else LoraSettings().target_modules
    per_rank = _lora_per_rank(model, tuple(targets))
    size = param_bytes or torch.empty((), dtype=getattr(torch, spec.dtype)).element_size()
    shape = ModelShape(total, total, size, Architecture.of(config), lora_params_per_rank=per_rank)
    return shape.with_lora(settings.r, "down_proj" not in targets) if settings is not None else shape
