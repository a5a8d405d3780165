"""Re-plan a committed ``gpu_scale.py`` run with today's planner: planned vs measured device peak.

    python benchmarks/replan_gpu.py benchmarks/results/gpu/memory_0.6B/gpu_scale.json [--out FILE]

For each variant the plan is rebuilt from the run's recorded settings (model config, precision,
LoRA, offload, the workload's bounds and the planned tokens per trajectory) and compared with
``torch.cuda.max_memory_allocated`` (which does not see the CUDA context, so the plan's fixed
``runtime`` row is left out of the comparison). Two plans per variant:

- ``planned``: the plan ``fit`` checks (the accumulator's bounds at their worst case);
- ``planned_at_reached``: the same plan with group sums and held gradients (and the offload
  buffers that exist only once a gradient is offloaded) at what the run reached, read from its
  ``accumulator_peak_bytes`` (the step gradient is one buffer of it), to show which rows the gap is.

Writes ``replan.json`` next to the input (or ``--out``) and prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

from thundersync_lightning.planning.memory_plan import (  # noqa: E402
    Architecture,
    ModelShape,
    PlanInputs,
    plan_memory,
)
from thundersync_lightning.strategy.memory_check import GPU_RUNTIME_BYTES  # noqa: E402

LORA_RANK = 16  # gpu_scale.py's LoraSettings(r=16)
ACCUMULATOR_ROWS = ("group sums", "held gradients", "staging")


def plan_inputs(
    run: dict[str, Any], variant: dict[str, Any], held: int | None = None, open_groups: int | None = None
) -> PlanInputs:
    """The plan of one recorded variant (bounds overridable: what the run reached)."""
    arch = Architecture.of(run["config"])
    e = 2 if "bf16" in variant["precision"] else 4
    base = ModelShape(
        variant["parameters"],
        variant["parameters"],
        e,
        arch,
        lora_params_per_rank=arch.lora_params_per_rank if arch else 0,
    )
    if variant["lora"]:
        base = replace_total(base, variant["parameters"] - LORA_RANK * base.lora_params_per_rank).with_lora(
            LORA_RANK
        )
    w = run["workload"]
    return PlanInputs(
        model=base,
        accelerator="gpu",
        offload=variant["strategy_options"].get("offload", "none"),
        sharding=variant["strategy_options"].get("sharding", "none"),
        mode=w["mode"],
        max_open_groups=w["max_open_groups"] if open_groups is None else open_groups,
        max_held_trajectories=w["max_held_trajectories"] if held is None else held,
        groups_per_step=w["groups"],
        group_size=w["group_size"],
        max_tokens_per_trajectory=variant["planned_tokens_per_trajectory"],
        max_batch_trajectories=w["max_batch_trajectories"],
        accumulator_bytes=4,
        device_overhead_bytes=GPU_RUNTIME_BYTES,
    )


def replace_total(shape: ModelShape, total: int) -> ModelShape:
    from dataclasses import replace

    return replace(shape, total_params=total, trainable_params=total)


def replan(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per variant: the measured peak, the committed plan, today's plan and today's plan at the
    accumulator state the run reached (device bytes, the ``runtime`` row left out)."""
    out: dict[str, dict[str, Any]] = {}
    for name, v in run["variants"].items():
        if "skipped" in v or v.get("peak_device_bytes") is None:
            continue
        plan = plan_memory(plan_inputs(run, v))
        runtime = plan.row("runtime").device if "runtime" in {r.name for r in plan.rows} else 0
        planned = plan.device_bytes - runtime
        step = plan.row("step gradient").device
        # what the accumulator reached beyond the step gradient (0: only the direct path was used)
        reached_buffers = max(0, v["accumulator_peak_bytes"] - step)
        on_device = v["strategy_options"].get("offload", "none") == "none"
        bound_rows = sum(plan.row(r).device for r in ACCUMULATOR_ROWS if r in {x.name for x in plan.rows})
        at_reached = planned - bound_rows + (reached_buffers if on_device else 0)
        if not on_device and reached_buffers:  # an offloaded gradient needs the staging buffers
            at_reached += plan.row("staging").device
        peak = v["peak_device_bytes"]
        out[name] = {
            "peak_device_bytes": peak,
            "committed_planned_bytes": v["planned_device_bytes"] - runtime,
            "planned_bytes": planned,
            "planned_at_reached_bytes": at_reached,
            "reached_accumulator_buffers_beyond_step_gradient": reached_buffers / max(1, step),
            "committed_planned_over_peak": (v["planned_device_bytes"] - runtime) / peak,
            "planned_over_peak": planned / peak,
            "planned_at_reached_over_peak": at_reached / peak,
            "rows": {r.name: r.device for r in plan.rows if r.device},
        }
    return out


def table(rows: dict[str, dict[str, Any]]) -> str:
    gib = 2**30
    lines = [
        "| variant | measured peak | committed plan | plan (bounds) | plan at the reached accumulator |",
        "|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {name} | {r['peak_device_bytes'] / gib:.2f} GiB | {r['committed_planned_bytes'] / gib:.2f} "
            f"GiB ({r['committed_planned_over_peak']:.2f}x) | {r['planned_bytes'] / gib:.2f} GiB "
            f"({r['planned_over_peak']:.2f}x) | {r['planned_at_reached_bytes'] / gib:.2f} GiB "
            f"({r['planned_at_reached_over_peak']:.2f}x) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> dict[str, dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a gpu_scale.json written on a GPU")
    parser.add_argument("--out", help="where to write the JSON (default: replan.json next to the run)")
    args = parser.parse_args(argv)
    path = Path(args.run)
    run = json.loads(path.read_text())
    rows = replan(run)
    out = Path(args.out) if args.out else path.with_name("replan.json")
    record = {
        "benchmark": "replan_gpu",
        "source": str(path),
        "device": run.get("device"),
        "workload": run.get("workload"),
        "variants": rows,
    }
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(table(rows))
    return rows


if __name__ == "__main__":
    main()
