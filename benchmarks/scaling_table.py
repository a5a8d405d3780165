"""The memory table of docs/scaling.md, computed by the planner (thundersync_lightning.planning.memory_plan).

Qwen3 0.6B / 1.7B / 8B / 32B (published architectures, counted exactly on PyTorch's meta device),
full fine-tune or LoRA (r=16 on q/k/v/o_proj), offload none or pinned, on one 80 GB GPU (80 GiB)
and one 141 GB GPU (H200, 140 GiB), with 1 TiB of host RAM. The workload: bf16 weights, AdamW,
groups of 8, one trajectory of 4096 tokens scored per forward (``max_batch_trajectories=1``),
``max_held_trajectories`` unbounded (planned at every trajectory of the open groups), the learner
alone on the GPU (a colocated vLLM takes its ``gpu_memory_utilization`` off the top).

Per row: the plan's device and pinned-host bytes with ``max_open_groups=1``; on each GPU the
largest ``max_open_groups`` (of 1..16) whose plan fits, or "no" when even one open group does not;
and the longest trajectory (a multiple of 1024 tokens, up to 32768) that fits the 141 GB GPU with
one open group.

Usage: python benchmarks/scaling_table.py [--write]   (--write replaces the table in docs/scaling.md)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from thundersync_lightning.core.types import ModelSpec  # noqa: E402
from thundersync_lightning.modules.lora import LoraSettings  # noqa: E402
from thundersync_lightning.modules.shape import QWEN3_ARCHITECTURES, model_shape  # noqa: E402
from thundersync_lightning.planning.memory_plan import PlanInputs, plan_memory  # noqa: E402
from thundersync_lightning.strategy.memory_check import GPU_RUNTIME_BYTES  # noqa: E402

DOC = Path(__file__).resolve().parents[1] / "docs" / "scaling.md"
BEGIN, END = "<!-- scaling_table.py: begin -->", "<!-- scaling_table.py: end -->"
GPUS = {"80 GB": 80 * 2**30, "141 GB": 140 * 2**30}
HOST = 2**40
LORA = LoraSettings(r=16, alpha=32)
MAX_GROUPS = 16


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def rows() -> list[dict[str, str]]:
    out = []
    for name, config in QWEN3_ARCHITECTURES.items():
        spec = ModelSpec(model_type="qwen3", config=config, dtype="bfloat16")
        for train, lora in (("full", None), ("LoRA r=16", LORA)):
            shape = model_shape(spec, lora)
            for offload in ("none", "pinned"):
                base = PlanInputs(
                    model=shape,
                    offload=offload,
                    group_size=8,
                    groups_per_step=MAX_GROUPS,
                    max_tokens_per_trajectory=4096,
                    max_batch_trajectories=1,
                    max_open_groups=1,
                    device_overhead_bytes=GPU_RUNTIME_BYTES,
                )
                plan = plan_memory(base)
                row = {
                    "model": name,
                    "train": train,
                    "offload": offload,
                    "device GiB": _gib(plan.device_bytes),
                    "pinned host GiB": _gib(plan.pinned_host_bytes),
                }
                for gpu, capacity in GPUS.items():
                    fitting = [
                        k
                        for k in range(1, MAX_GROUPS + 1)
                        if plan_memory(replace(base, max_open_groups=k)).fits(capacity, HOST).fits
                    ]
                    row[gpu] = f"yes, max_open_groups <= {max(fitting)}" if fitting else "no"
                longest = [
                    t
                    for t in range(1024, 32768 + 1, 1024)
                    if plan_memory(replace(base, max_tokens_per_trajectory=t)).fits(GPUS["141 GB"], HOST).fits
                ]
                row["longest trajectory on 141 GB"] = f"{max(longest)} tokens" if longest else "< 1024 tokens"
                out.append(row)
    return out


def table() -> str:
    data = rows()
    keys = list(data[0])
    lines = ["| " + " | ".join(keys) + " |", "|" + "|".join("---" for _ in keys) + "|"]
    lines += ["| " + " | ".join(r[k] for k in keys) + " |" for r in data]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the table in docs/scaling.md")
    args = parser.parse_args(argv)
    text = table()
    if not args.write:
        print(text)
        return
    doc = DOC.read_text()
    start, end = doc.index(BEGIN) + len(BEGIN), doc.index(END)
    DOC.write_text(doc[:start] + "\n" + text + "\n" + doc[end:])
    print(f"wrote the table into {DOC}")


if __name__ == "__main__":
    sys.exit(main())
