"""A local model directory of a published Qwen3 shape with random weights (no Hub access).

    python scripts/random_model.py DIR [--shape 0.6B] [--layers N] [--dtype bfloat16] [--seed 0]

Writes ``config.json`` (the published dimensions: ``QWEN3_ARCHITECTURES``, with ``--layers``
decoder layers when given, for hosts that cannot hold every layer) and ``model.safetensors``, the
layout ``from_pretrained`` and vLLM load. The shipped GPU configs run on CPU from such a directory
(``--model.pretrained_path=DIR``; ``tests/rollout/vllm/test_config_shipped_gpu.py``). No tokenizer: the
configs' vLLM engine takes token ids (``skip_tokenizer_init``) and the guessing game has its own.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torch  # noqa: E402

from thundersync_lightning.modules.shape import QWEN3_ARCHITECTURES  # noqa: E402
from thundersync_lightning.rollout.vllm.model import write_model_dir  # noqa: E402


def build(
    directory: str, shape: str = "0.6B", layers: int | None = None, dtype: str = "bfloat16", seed: int = 0
) -> str:
    """Write the random model to ``directory``; returns it."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if f"Qwen3-{shape}" not in QWEN3_ARCHITECTURES:
        raise SystemExit(
            f"--shape {shape}: not one of {sorted(k.removeprefix('Qwen3-') for k in QWEN3_ARCHITECTURES)}"
        )
    settings = dict(QWEN3_ARCHITECTURES[f"Qwen3-{shape}"])
    if layers is not None:
        settings["num_hidden_layers"] = layers
    torch.manual_seed(seed)
    config = AutoConfig.for_model("qwen3", **settings)
    model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return write_model_dir(model, directory)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--shape", default="0.6B")
    parser.add_argument(
        "--layers", type=int, default=None, help="decoder layers (default: the published count)"
    )
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(build(args.directory, args.shape, args.layers, args.dtype, args.seed))


if __name__ == "__main__":
    main()
