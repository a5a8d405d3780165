"""A 0.6B/1.7B learner on one CUDA device: bf16 vs fp32, offload on vs off, ZeRO-1, and the memory
plan against ``torch.cuda.max_memory_allocated``.

A randomly initialised policy of a published Qwen3 shape (``QWEN3_ARCHITECTURES``, no Hub access)
runs a few streaming steps per variant through a real ``Trainer.fit`` with ``ThunderSyncStrategy``;
rollouts come from the trace-replay engine (``paper_tail`` at ``--time-scale`` seconds per unit:
no generation cost, so a step is the learner's own work). Variants:

    fp32          precision="32-true", offload="none"
    bf16          precision="bf16-true" (bf16 weights, fp32 gradient sums), offload="none"
    bf16_pinned   bf16, offload="pinned" (sums and held gradients in page-locked host memory,
                  copied on a side stream)
    bf16_zero1    bf16, sharding="zero1" (in one process there is nothing to shard: the optimizer
                  is used as it is, so this checks the path runs and costs nothing)
    fsdp2         not applicable on one process: the reason is the strategy's own set-up check

Per variant: median step seconds and learner busy seconds (steps after ``--warmup``), peak device
bytes (``torch.cuda.max_memory_allocated``, reset before the fit) and the planner's device bytes for
that exact fit (``memory_check.fit_plan``, read at ``on_train_start``) with their ratio. The plan is
a bound, not a simulation: ratio <= 1 is expected, and the rows say where the slack is (the plan's
activations assume ``max_batch_trajectories`` trajectories of the task's longest episode; it also
counts ``GPU_RUNTIME_BYTES`` for the CUDA context, which the allocator does not see, so the ratio
is given with and without that row). Ratios, measured in one run:

    bf16 / fp32            step seconds and peak bytes
    bf16_pinned / bf16     step and busy seconds (the check: a backward is not slower with offload
                           on) and peak bytes (the device bytes offload saves)
    bf16_zero1 / bf16      step seconds

``--device cpu --tiny``: a tiny model, one step, on the CPU (seconds; a smoke test of the code
paths). Pinned offload needs CUDA and timings/peaks there are not meaningful: each skip is recorded
with its reason.

    python benchmarks/gpu_scale.py --model 0.6B --out benchmarks/results/gpu
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402

from _common import add_common_args, median, write_bar_chart, write_result  # noqa: E402
from _harness import fit, load_average, qwen3_config  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.modules.lora import LoraSettings  # noqa: E402
from thundersync_lightning.modules.shape import QWEN3_ARCHITECTURES  # noqa: E402
from thundersync_lightning.rollout import TraceReplayEngineConfig  # noqa: E402
from thundersync_lightning.rollout.replay import load_trace  # noqa: E402
from thundersync_lightning.strategy.memory_check import GPU_RUNTIME_BYTES, fit_plan  # noqa: E402
from thundersync_lightning.strategy.sharding import SHARDINGS  # noqa: E402

NAME = "gpu_scale"
#: variant -> (precision, strategy options)
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "fp32": ("32-true", {}),
    "bf16": ("bf16-true", {}),
    "bf16_pinned": ("bf16-true", {"offload": "pinned"}),
    "bf16_zero1": ("bf16-true", {"sharding": "zero1"}),
    # LoRA (r=16 on the attention projections): only the adapters train, sums and held gradients shrink
    "bf16_lora": ("bf16-true", {"lora": True}),
    "bf16_lora_pinned": ("bf16-true", {"lora": True, "offload": "pinned"}),
}
#: run when --variants is not given
DEFAULT_VARIANTS = ("fp32", "bf16", "bf16_pinned", "bf16_zero1")
LORA = LoraSettings(r=16, alpha=32)
#: (numerator, denominator) variants of the reported ratios
RATIOS = (
    ("bf16", "fp32"),
    ("bf16_pinned", "bf16"),
    ("bf16_zero1", "bf16"),
    ("bf16_lora", "bf16"),
    ("bf16_lora_pinned", "bf16_lora"),
)


def model_config(name: str, tiny: bool) -> dict[str, Any]:
    """The published Qwen3 shape (``--model``), or a tiny Qwen3 for ``--tiny``."""
    if tiny:
        return qwen3_config(64, 128, 1, 256)
    return dict(QWEN3_ARCHITECTURES[f"Qwen3-{name}"])


@dataclass(frozen=True, slots=True)
class TraceBoundTasks(GuessingGameTasks):
    """The guessing game's tasks with the replayed trace's episode bound: the trace-replay engine
    makes trajectories of the trace's lengths, not the game's, and the plan sizes activations from
    ``max_episode_tokens``."""

    episode_tokens: int = 1

    def max_episode_tokens(self) -> int:
        return self.episode_tokens


def trace_episode_tokens(engine: TraceReplayEngineConfig) -> int:
    """The longest episode the engine replays: the prompt, the longest scored row (times
    ``token_scale``) and the observations between its turns."""
    longest = max(max(1, round(r.scored_tokens * engine.token_scale)) for r in load_trace(engine.trace))
    return engine.prompt_tokens + longest + (min(engine.turns, longest) - 1) * engine.observation_tokens


class PlanAndPeak(Callback):
    """Plans the fit as ``fit`` checks it (``fit_plan``, at train start: strategy and module set up),
    and keeps the device's peak allocated bytes at the end of the fit."""

    def __init__(self) -> None:
        self.plan: Any = None
        self.peak: int | None = None

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.plan = fit_plan(trainer, trainer.strategy)

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            self.peak = int(torch.cuda.max_memory_allocated(device))


def skip_reason(variant: str, device: torch.device) -> str | None:
    """Why ``variant`` cannot run on ``device`` (None: it runs)."""
    _, options = VARIANTS[variant]
    if options.get("offload") == "pinned" and device.type != "cuda":
        return (
            "offload='pinned' needs CUDA (page-locked host memory and a copy stream); this run is on the CPU"
        )
    return None


def run_variant(variant: str, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    precision, options = VARIANTS[variant]
    options = dict(options)
    lora = options.pop("lora", False)
    torch.manual_seed(0)
    policy = GRPOPolicy(config=model_config(args.model, args.tiny), lr=1e-6, lora=LORA if lora else None)
    engine = TraceReplayEngineConfig(time_scale_s=args.time_scale, token_scale=args.token_scale)
    data = RolloutDataModule(
        tasks=TraceBoundTasks(latency="none", episode_tokens=trace_episode_tokens(engine)),
        engine=engine,
        group_size=args.group_size,
        groups_per_step=args.groups,
        seed=0,
    )
    probe = PlanAndPeak()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    record = fit(
        "streaming", policy, data, args.steps, device="gpu" if device.type == "cuda" else "cpu",
        callbacks=[probe], trainer_kwargs={"precision": precision}, max_open_groups=args.max_open_groups,
        max_held_trajectories=args.max_held, max_batch_trajectories=args.max_batch_trajectories, **options,
    )  # fmt: skip
    wall = time.perf_counter() - start
    timed = record.steps[args.warmup :] or record.steps  # one step (--tiny): time it, warm or not
    plan = probe.plan
    planned = plan.device_bytes
    planned_no_runtime = planned - (GPU_RUNTIME_BYTES if device.type == "cuda" else 0)
    out: dict[str, Any] = {
        "precision": precision,
        "strategy_options": options,
        "lora": lora,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "trainable_parameters": sum(p.numel() for p in policy.parameters() if p.requires_grad),
        "param_dtype": str(next(policy.parameters()).dtype),
        "steps": len(record.steps),
        "timed_steps": len(timed),
        "fit_wall_s": wall,
        "median_step_s": median(s.step_end - s.step_start for s in timed),
        "median_busy_s": median(sum(i.seconds for i in s.busy) for s in timed),
        "learner_tokens_per_step": median(s.learner_tokens for s in timed),
        "longest_trajectory_tokens": max(
            (t.num_tokens for s in record.steps for t in s.trajectories), default=None
        ),
        "accumulator_peak_bytes": max(s.accumulator.total for s in record.steps),
        "planned_device_bytes": planned,
        "planned_host_bytes": plan.host_bytes,
        "planned_rows": {r.name: r.total for r in plan.rows},
        "planned_tokens_per_trajectory": plan.inputs.max_tokens_per_trajectory,
        "peak_device_bytes": probe.peak,
    }
    if probe.peak is None:
        out["peak_device_bytes_reason"] = (
            "torch.cuda.max_memory_allocated is CUDA-only; this run is on the CPU"
        )
    else:
        out["peak_over_planned"] = probe.peak / planned
        out["peak_over_planned_without_runtime"] = probe.peak / max(1, planned_no_runtime)
    del policy, data, record
    return out


def ratios(variants: dict[str, dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """``a/b`` -> step, busy and peak ratios (None where a side did not run or has no peak)."""
    out: dict[str, dict[str, float | None]] = {}
    for a, b in RATIOS:
        ra, rb = variants.get(a), variants.get(b)
        if ra is None or rb is None or "skipped" in ra or "skipped" in rb:
            continue
        peak = ra["peak_device_bytes"], rb["peak_device_bytes"]
        out[f"{a}/{b}"] = {
            "step_s": ra["median_step_s"] / rb["median_step_s"],
            "busy_s": ra["median_busy_s"] / rb["median_busy_s"],
            "peak_device_bytes": peak[0] / peak[1] if None not in peak else None,
        }
    return out


def figure(path: Any, variants: dict[str, dict[str, Any]], cuda: bool) -> None:
    ran = {k: v for k, v in variants.items() if "skipped" not in v}
    groups = {
        k: {
            "step s": v["median_step_s"],
            "busy s": v["median_busy_s"],
            "planned GiB": (v["planned_device_bytes"] or v["planned_host_bytes"]) / 2**30,
            **({"peak GiB": v["peak_device_bytes"] / 2**30} if v["peak_device_bytes"] is not None else {}),
        }
        for k, v in ran.items()
    }
    where = "max_memory_allocated vs plan" if cuda else "CPU smoke run: no device peak"
    write_bar_chart(
        path, groups, ylabel="seconds / GiB", title=f"gpu_scale: step time and device bytes ({where})"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)
    parser.add_argument("--device", default="cuda", choices=["cpu", "cuda"])
    parser.add_argument("--model", default="0.6B", choices=["0.6B", "1.7B"], help="a published Qwen3 shape")
    parser.add_argument("--tiny", action="store_true", help="a tiny model and one step (CPU smoke test)")
    parser.add_argument("--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--steps", type=int, default=None, help="steps per variant (default 4; --tiny 1)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 1; --tiny 0)")
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-open-groups", type=int, default=2)
    parser.add_argument("--max-held", type=int, default=4, help="max_held_trajectories")
    parser.add_argument("--max-batch-trajectories", type=int, default=2)
    parser.add_argument("--time-scale", type=float, default=1e-4, help="paper_tail seconds per unit")
    parser.add_argument("--token-scale", type=float, default=1.0, help="longer trajectories (compute-bound)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error(
            "--device cuda: torch.cuda.is_available() is False on this machine (use --device cpu --tiny)"
        )
    if args.tiny:
        args.groups, args.group_size = min(args.groups, 2), min(args.group_size, 2)
    args.steps = args.steps or (1 if args.tiny else 4)
    args.warmup = args.warmup if args.warmup is not None else (0 if args.tiny else 1)
    torch.set_num_threads(args.threads)
    load_start = load_average()

    variants: dict[str, dict[str, Any]] = {}
    for name in args.variants:
        reason = skip_reason(name, device)
        if reason is not None:
            variants[name] = {"skipped": reason}
            print(f"{name}: skipped ({reason})", flush=True)
            continue
        r = variants[name] = run_variant(name, args, device)
        peak = "n/a" if r["peak_device_bytes"] is None else f"{r['peak_device_bytes'] / 2**30:.2f} GiB"
        print(
            f"{name}: step {r['median_step_s']:.3f} s, busy {r['median_busy_s']:.3f} s, peak {peak}, "
            f"planned {r['planned_device_bytes'] / 2**30:.2f} GiB", flush=True,
        )  # fmt: skip
    fsdp2 = SHARDINGS["fsdp2"].problems(1)
    not_applicable = {"fsdp2": fsdp2[0] if fsdp2 else None}
    results = {
        "description": "bf16 vs fp32, offload pinned vs none, ZeRO-1, measured peak vs planned device bytes",
        "model": "tiny" if args.tiny else f"Qwen3-{args.model} (random init)",
        "config": model_config(args.model, args.tiny),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "variants": variants,
        "ratios": ratios(variants),
        "not_applicable": not_applicable,
        "workload": {
            "engine": f"TraceReplayEngineConfig(trace='paper_tail', time_scale_s={args.time_scale}, "
            f"token_scale={args.token_scale})",
            "mode": "streaming",
            "groups": args.groups,
            "group_size": args.group_size,
            "steps": args.steps,
            "warmup": args.warmup,
            "max_open_groups": args.max_open_groups,
            "max_held_trajectories": args.max_held,
            "max_batch_trajectories": args.max_batch_trajectories,
        },
        "threads": args.threads,
        "quick": args.quick,
        "tiny": args.tiny,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    path = write_result(args.out, NAME, results)
    figure(path.with_suffix(".png"), variants, device.type == "cuda")
    for key, r in results["ratios"].items():
        print(f"{key}: " + ", ".join(f"{k} {v:.3f}" for k, v in r.items() if v is not None))
    print(f"fsdp2: not applicable ({not_applicable['fsdp2']})")
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
