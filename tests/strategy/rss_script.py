"""Run in a fresh process: the planner's weights + gradients + AdamW + accumulator bytes vs RSS growth.

A Qwen3 of a few million parameters is built, then the accumulator sees the event order that fills
the planned buffers: one fully rewarded group (the step gradient), then two open groups
(``max_open_groups=2``) with two rewarded trajectories (two sums each) and two scored before their
rewards (held, ``max_held_trajectories=4``). The barrier writes ``.grad`` and AdamW steps once.
Accumulator buffers stay allocated (the store's free list), so the final RSS holds the peak.
Prints one JSON line: the planned rows, the accounted accumulator peak and the RSS growth.
"""

from __future__ import annotations

import gc
import json

import psutil
import torch

from thundersync_lightning.core.accumulator.streaming import StreamingGRPO
from thundersync_lightning.core.types import ModelSpec
from thundersync_lightning.planning.memory_plan import Architecture, ModelShape, PlanInputs, plan_memory
from thundersync_lightning.rollout.hf_model import build_model

CONFIG = {
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "tie_word_embeddings": False,
}
ROWS = ("weights", "gradients", "optimizer state", "group sums", "held gradients", "step gradient")


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def logprob(model: torch.nn.Module, seed: int) -> torch.Tensor:
    ids = torch.randint(0, model.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(seed))
    logits = model(input_ids=ids).logits[:, :-1]
    return torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).sum()


def run(model: torch.nn.Module, params: list[torch.Tensor]) -> StreamingGRPO:
    acc = StreamingGRPO(params)
    acc.open_group("c", ["c0", "c1"])  # all rewards first: the direct path, into the step gradient
    for k, r in enumerate((1.0, 0.0)):
        acc.add_reward(f"c{k}", r)
    for k in range(2):
        acc.add_logprob(f"c{k}", logprob(model, k))
    for g in ("a", "b"):
        ids = [f"{g}{k}" for k in range(4)]
        acc.open_group(g, ids)
        for k, r in enumerate((1.0, 0.0)):  # two reward values: two sums
            acc.add_reward(ids[k], r)
            acc.add_logprob(ids[k], logprob(model, 10 + k))
        for k in (2, 3):  # scored before their rewards: held
            acc.add_logprob(ids[k], logprob(model, 20 + k))
    for g in ("a", "b"):
        acc.add_reward(f"{g}2", 1.0)
        acc.add_reward(f"{g}3", 0.0)
    acc.report = acc.finish()  # type: ignore[attr-defined]
    return acc


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    warm = build_model(
        ModelSpec(
            config={
                **CONFIG,
                "vocab_size": 32,
                "hidden_size": 64,
                "intermediate_size": 64,
                "num_hidden_layers": 1,
                "num_attention_heads": 1,
            }
        )
    ).train()
    run(warm, list(warm.parameters()))  # lazy initialisation of autograd, threads and allocator pools
    torch.optim.AdamW(warm.parameters()).step()
    del warm
    before = rss()
    model = build_model(ModelSpec(config=CONFIG)).train()
    params = list(model.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    acc = run(model, params)
    optimizer.step()
    measured = rss() - before
    n = sum(p.numel() for p in params)
    plan = plan_memory(
        PlanInputs(
            ModelShape(n, n, 4, Architecture.of(model.config)),
            accelerator="cpu",
            groups_per_step=3,
            group_size=4,
            max_open_groups=2,
            max_held_trajectories=4,
            max_tokens_per_trajectory=12,
            max_batch_trajectories=1,
        )
    )
    print(
        json.dumps(
            {
                "params": n,
                "planned": {r: plan.row(r).total for r in ROWS},
                "planned_accumulator": plan.bytes_of("group sums", "held gradients", "step gradient"),
                "accounted_accumulator_peak": acc.report.peak_bytes.total,  # type: ignore[attr-defined]
                "measured_rss_growth": measured,
            }
        )
    )


if __name__ == "__main__":
    main()
