"""``overlap.py``'s VRAM report (the ``paper`` workload's last columns): peak device memory per
mode and streaming's extra over sync, next to what the memory planner predicts for the same fit.

The paper reports +5.8 GB of VRAM per learner GPU for streaming over sync (27B, 8 B200s). Here the
extra is ``torch.cuda.max_memory_allocated`` of the streaming fits less that of the sync fits
(each mode's maximum over its blocks; the plan's fixed ``runtime`` row, the CUDA context, is
outside both), and the planned extra is the difference of the two modes' plans: the group sums
and held gradients streaming keeps and sync does not (``planning/memory_plan.py``). On a CPU the
measured columns are null (the planner's numbers stay).
"""

from __future__ import annotations

import argparse
from typing import Any

from thundersync_lightning.planning.memory_plan import (
    FIXED_BATCH_TRAJECTORIES,
    Architecture,
    ModelShape,
    PlanInputs,
    plan_memory,
)
from thundersync_lightning.rollout.replay import load_trace

__all__ = ["vram_report"]


def planned_device_bytes(args: argparse.Namespace, config: dict, num_params: int, mode: str) -> int:
    """The planner's device bytes of one mode's fit (runtime row excluded: the allocator does not see it)."""
    arch = Architecture.of(config)
    e = {"bf16-true": 2, "16-true": 2}.get(args.precision, 4)
    longest = max(r.scored_tokens for r in load_trace(args.trace))  # the trace's longest row
    tokens = (
        args.prompt_tokens + round(longest * args.token_scale) + (args.turns - 1) * args.observation_tokens
    )
    # "auto" is planned at its floor, as a plan with no machine given is (memory_plan.py)
    rows = FIXED_BATCH_TRAJECTORIES if args.max_batch_trajectories == "auto" else args.max_batch_trajectories
    plan = plan_memory(
        PlanInputs(
            ModelShape(num_params, num_params, e, arch), accelerator="gpu", mode=mode, offload=args.offload,
            max_open_groups=args.max_open_groups, max_held_trajectories=args.max_held_trajectories,
            groups_per_step=args.groups, group_size=args.group_size, max_tokens_per_trajectory=tokens,
            max_batch_trajectories=rows, max_batch_tokens=args.max_batch_tokens,
            score_max_padding=args.score_max_padding, score_forward_tokens=args.score_forward_tokens,
        )
    )  # fmt: skip
    return plan.device_bytes


def vram_report(
    args: argparse.Namespace, modes: dict[str, dict], config: dict, num_params: int
) -> dict[str, Any]:
    """Peak VRAM per mode, streaming's extra over sync, and the plan's prediction of both."""
    peak = {m: r.get("peak_vram_bytes") for m, r in modes.items()}
    planned = {m: planned_device_bytes(args, config, num_params, m) for m in modes}
    measured_extra = (
        None
        if peak.get("streaming") is None or peak.get("sync") is None
        else (peak["streaming"] - peak["sync"])
    )
    planned_extra = planned["streaming"] - planned["sync"]
    return {
        "peak_bytes": peak,
        "planned_bytes": planned,
        "streaming_extra_over_sync_bytes": measured_extra,
        "planned_streaming_extra_over_sync_bytes": planned_extra,
        "peak_over_planned": {m: None if peak[m] is None else peak[m] / planned[m] for m in modes},
        "paper_streaming_extra_gb": 5.8,
    }
