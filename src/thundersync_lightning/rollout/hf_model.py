"""Build a policy architecture from a :class:`ModelSpec` (weights come later, by publish)."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..core.errors import ConfigError
from ..core.types import ModelSpec

__all__ = ["build_model", "cache_kwarg"]


def cache_kwarg(model: Any) -> str:
    """The forward's key/value-cache argument: ``cache`` in newer transformers, ``past_key_values``
    before (deprecated since 5.x). A PEFT wrapper forwards ``**kwargs``: its base model decides."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def build_model(spec: ModelSpec, device: str | torch.device = "cpu") -> Any:
    """A ``transformers`` causal LM for ``spec``, in eval mode, on ``device``.

    With ``spec.pretrained_path`` the model is loaded from that local directory; otherwise it is
    built from ``AutoConfig.for_model(spec.model_type, **spec.config)`` with random weights.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = getattr(torch, spec.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(
            f"ModelSpec.dtype={spec.dtype!r} is not a torch dtype; use e.g. 'float32' or 'bfloat16'."
        )
    if spec.pretrained_path is not None:
        model = AutoModelForCausalLM.from_pretrained(spec.pretrained_path, dtype=dtype, local_files_only=True)
    else:
        try:
            config = AutoConfig.for_model(spec.model_type, **dict(spec.config))
        except (ValueError, KeyError) as exc:
            raise ConfigError(
                f"ModelSpec(model_type={spec.model_type!r}) is not a transformers model type ({exc}); "
                "use a registered type such as 'qwen3', or set pretrained_path."
            ) from exc
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.to(device).eval()
