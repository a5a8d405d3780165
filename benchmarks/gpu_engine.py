"""The whole loop on one device: the embedded engine generating, the learner training, a tool task.

A streaming fit of ``--steps`` steps (``ThunderSyncStrategy(mode="streaming")``) in which the
embedded engine (``EmbeddedEngineConfig(device=...)``: its own process, batched generation with a
KV cache, :mod:`thundersync_lightning.rollout.embedded.generator`) and the learner share the device.
The task is the branch demo's native tool calls (``BranchTasks``, ``max_turns`` calls per episode,
an error result lets the model call again) with the tokenizer and chat template of
:mod:`thundersync_lightning.envs.branches.start` (built here, seconds). The policy has the
Qwen3-0.6B dimensions (``--model 0.6B``: 28 layers, hidden 1024) with that tokenizer's vocabulary
and random weights, so most turns are not valid calls; what is measured is the loop, not learning.

Reported (``gpu_engine.json``): engine tokens per second (tokens generated over the step's
rollout makespan, from issue to the last content, per measured step), the learner's idle fraction,
the largest staleness (0 in streaming), turns and tool calls per trajectory; ``trajectories.jsonl``
holds every trajectory's record with its decoded text (the trajectory log).

    python benchmarks/gpu_engine.py --device cuda --out DIR             # the GPU check's engine section
    python benchmarks/gpu_engine.py --device cpu --tiny --out DIR       # its dry run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _common import add_common_args, write_result  # noqa: E402
from _harness import fit  # noqa: E402
from thundersync_lightning.envs.branches import BranchTasks  # noqa: E402
from thundersync_lightning.envs.branches.start import save_tokenizer  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.modules.shape import QWEN3_ARCHITECTURES  # noqa: E402
from thundersync_lightning.rollout import EmbeddedEngineConfig  # noqa: E402

NAME = "gpu_engine"
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 32, "tie_word_embeddings": True}  # fmt: skip


def model_config(model: str, vocab: int, max_positions: int) -> dict[str, Any]:
    """The published shape (or a tiny Qwen3) with the task tokenizer's vocabulary."""
    shape = dict(TINY) if model == "tiny" else dict(QWEN3_ARCHITECTURES[f"Qwen3-{model}"])
    return {**shape, "vocab_size": vocab, "max_position_embeddings": max_positions}


def step_rows(steps: list[Any], warmup: int) -> list[dict[str, Any]]:
    rows = []
    for s in steps[warmup:] or steps:
        issued = s.rollout_issued_at if s.rollout_issued_at is not None else s.step_start
        last = max(t.content_ready_at for t in s.trajectories)
        tokens = sum(t.num_scored_tokens for t in s.trajectories)
        rows.append({
            "step": s.step, "wall_s": s.wall_seconds, "idle_fraction": s.idle_fraction,
            "staleness_max": s.staleness_max, "generated_tokens": tokens, "rollout_makespan_s": last - issued,
            "engine_tokens_per_s": tokens / max(1e-9, last - issued),
            "turns_mean": statistics.mean(t.num_turns for t in s.trajectories),
            "tool_calls": sum(t.tool_calls for t in s.trajectories),
            "invalid_tool_calls": sum(t.invalid_tool_calls for t in s.trajectories),
        })  # fmt: skip
    return rows


def trajectory_log(path: Path, steps: list[Any], tokenizer: Any) -> None:
    with path.open("w") as f:
        for s in steps:
            for t in s.trajectories:
                text = tokenizer.decode([tok for seg in t.segments for tok in seg.tokens])
                f.write(json.dumps({
                    "step": s.step, "trajectory_id": t.trajectory_id, "reward": t.reward,
                    "staleness": t.staleness, "turns": t.num_turns, "tool_calls": t.tool_calls,
                    "invalid_tool_calls": t.invalid_tool_calls,
                    "tokens": t.num_tokens, "finish_reason": t.finish_reason, "text": text,
                }) + "\n")  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_common_args(parser, default_threads=1)
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"]
    )
    parser.add_argument("--model", default="0.6B", choices=["0.6B", "1.7B", "tiny"])
    parser.add_argument("--tiny", action="store_true", help="a tiny Qwen3 (the dry run)")
    parser.add_argument("--precision", default=None, help="Lightning precision (default bf16-true on CUDA)")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1, help="unmeasured steps (the engine's start)")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument("--max-action-tokens", type=int, default=64, help="tokens per turn")
    parser.set_defaults(out=Path("runs/bench-gpu-engine"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = "tiny" if args.tiny else args.model
    precision = args.precision or ("bf16-true" if args.device == "cuda" else "32-true")
    tokenizer_dir = args.out / "tokenizer"
    started = time.monotonic()
    save_tokenizer(str(tokenizer_dir))
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    config = model_config(model, len(tokenizer), 4096)
    torch.manual_seed(0)
    # the engine builds its copy from the policy's ModelSpec: in bf16 too, on args.device
    policy = GRPOPolicy(config=config, lr=1e-6, dtype="bfloat16" if precision == "bf16-true" else "float32")
    data = RolloutDataModule(
        tasks=BranchTasks(str(tokenizer_dir), max_turns=args.max_turns,
                          max_action_tokens=args.max_action_tokens),
        engine=EmbeddedEngineConfig(device=args.device), group_size=args.group_size,
        groups_per_step=args.groups, seed=0,
    )  # fmt: skip
    device = "gpu" if args.device == "cuda" else "cpu"
    record = fit(
        "streaming", policy, data, args.steps, device=device, trainer_kwargs={"precision": precision}
    )
    rows = step_rows(record.steps, args.warmup)
    args.out.mkdir(parents=True, exist_ok=True)
    trajectory_log(args.out / "trajectories.jsonl", record.steps, tokenizer)
    result = {
        "device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
        "model": model, "config": config, "precision": precision,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "task": {"tasks": "BranchTasks", "max_turns": args.max_turns,
                 "max_action_tokens": args.max_action_tokens, "groups": args.groups,
                 "group_size": args.group_size},
        "steps": args.steps, "warmup": args.warmup, "rows": rows,
        "engine_tokens_per_s_median": statistics.median(r["engine_tokens_per_s"] for r in rows),
        "learner_idle_fraction_median": statistics.median(r["idle_fraction"] for r in rows),
        "staleness_max": max(s.staleness_max for s in record.steps),
        "turns_mean": statistics.mean(r["turns_mean"] for r in rows),
        "tool_calls": sum(r["tool_calls"] for r in rows),
        "invalid_tool_calls": sum(r["invalid_tool_calls"] for r in rows),
        "seconds": time.monotonic() - started,
    }  # fmt: skip
    if args.device == "cuda":
        result["peak_vram_bytes"] = int(
            torch.cuda.max_memory_allocated()
        )  # the learner's (the engine is another process)
    path = write_result(args.out, NAME, result)
    print(f"engine {result['engine_tokens_per_s_median']:.0f} tokens/s, learner idle "
          f"{result['learner_idle_fraction_median']:.1%}, staleness max {result['staleness_max']}, "
          f"{result['turns_mean']:.2f} turns per trajectory; wrote {path}")  # fmt: skip
    return result


if __name__ == "__main__":
    main()
