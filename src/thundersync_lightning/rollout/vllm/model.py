"""The policy's architecture on disk, for vLLM to load, and the weight names it expects.

vLLM builds its model from a Hugging Face directory. From a :class:`ModelSpec` we either use
``pretrained_path`` as is, or write ``config.json`` plus random weights (their values never
matter: the learner publishes its own before the first rollout). The expected names and shapes
come from a meta-device copy of the Hugging Face model (no memory), so a publish can be checked
before anything is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...core.errors import ConfigError, EngineError
from ...core.types import ModelSpec
from .worker import save_weights_file

__all__ = ["ModelLayout", "materialize_model", "check_weights", "write_model_dir"]


@dataclass(frozen=True, slots=True)
class ModelLayout:
    """Where vLLM loads from and what ``publish`` must provide (HF ``state_dict`` names)."""

    path: str
    shapes: Mapping[str, tuple[int, ...]]
    optional: frozenset[str]  # names a publish may omit (a tied lm_head)
    max_position_embeddings: int | None


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ConfigError(f"ModelSpec.dtype={name!r} is not a torch dtype; use e.g. 'float32' or 'bfloat16'")
    return dtype


def materialize_model(spec: ModelSpec, dest: str) -> ModelLayout:
    """Write ``spec``'s architecture to ``dest`` (unless pretrained) and return its layout."""
    from transformers import AutoConfig, AutoModelForCausalLM

    dtype = _dtype(spec.dtype)
    if spec.pretrained_path is not None:
        config = AutoConfig.from_pretrained(spec.pretrained_path)
        path = spec.pretrained_path
    else:
        try:
            config = AutoConfig.for_model(spec.model_type, **dict(spec.config))
        except (KeyError, ValueError, TypeError) as exc:
            raise ConfigError(
                f"cannot build a {spec.model_type!r} config from ModelSpec.config={dict(spec.config)}: {exc}"
            ) from exc
        path = write_model_dir(AutoModelForCausalLM.from_config(config).to(dtype), dest)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    shapes = {name: tuple(t.shape) for name, t in meta.state_dict().items()}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    optional = frozenset(n for n in shapes if tied and n == "lm_head.weight")
    return ModelLayout(path, shapes, optional, getattr(config, "max_position_embeddings", None))


def write_model_dir(model: torch.nn.Module, dest: str) -> str:
    """Write a ``transformers`` causal LM (its config and weights) to ``dest`` for vLLM; returns ``dest``."""
    # Written by hand: save_pretrained writes nothing on ranks != 0 under torch.distributed,
    # and every learner rank starts its own engine.
    config: Any = model.config
    os.makedirs(dest, exist_ok=True)
    config.architectures = [type(model).__name__]
    config.to_json_file(os.path.join(dest, "config.json"))
    save_weights_file(model.state_dict(), os.path.join(dest, "model.safetensors"))
    return dest


def check_weights(layout: ModelLayout, weights: Mapping[str, torch.Tensor]) -> None:
    """Raise :class:`EngineError` listing every missing, unexpected or misshapen tensor."""
    problems: list[str] = []
    missing = sorted(set(layout.shapes) - set(weights) - layout.optional)
    unexpected = sorted(set(weights) - set(layout.shapes))
    if missing:
        problems.append(f"missing {len(missing)} tensors (first: {missing[:3]})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected names (first: {unexpected[:3]})")
    for name, tensor in weights.items():
        want = layout.shapes.get(name)
        if not isinstance(tensor, torch.Tensor):
            problems.append(f"{name} is a {type(tensor).__name__}, not a tensor")
        elif want is not None and tuple(tensor.shape) != want:
            problems.append(f"{name} has shape {tuple(tensor.shape)}, the engine's model has {want}")
    if problems:
        raise EngineError(
            "publish refused, nothing was loaded: "
            + "; ".join(problems)
            + ". Publish the learner's Hugging Face state_dict (model.state_dict() of the same "
            "architecture as the engine's ModelSpec; unwrap LoRA/DDP/compile wrappers first)."
        )
