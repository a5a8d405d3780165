"""The tiny model the small task families train on a CPU (the guessing game, the mutation tasks)."""

from __future__ import annotations

from ..core.types import ModelSpec

__all__ = ["toy_model_spec"]


def toy_model_spec(vocab_size: int = 16) -> ModelSpec:
    """The tiny Qwen3 (~150k parameters) that learns the guessing game on 2 CPU cores.

    Hidden size 64, 2 layers, 4 query / 2 key-value heads of ``head_dim`` 64 (vLLM rejects
    smaller head dims), untied output head. What it learns on the default game in ``make demo``'s
    300 steps: ``benchmarks/results/demo.json`` (written by ``benchmarks/demo_run.py``).
    """
    return ModelSpec(
        model_type="qwen3",
        config={
            "vocab_size": vocab_size,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "max_position_embeddings": 64,
            "tie_word_embeddings": False,
        },
    )
