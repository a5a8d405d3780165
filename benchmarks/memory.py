"""Streaming accumulator memory vs open groups, offload mode and model size, against the analytic
2 x P x 4 bytes per open group (two float32 gradient sums of P trainable parameters per group).

Part 1, the accumulator itself (``StreamingGRPO``, the class the strategy drives): for each model
size and offload mode, groups of three trajectories are opened one after another; in each, one
trajectory with reward 1 and one with reward 0 are scored by the policy's real forward
(``GRPOPolicy.trajectory_logprobs``) and backpropagated, creating the group's two sums, while the
third keeps the group open. After each group: the accumulator's byte count (``bytes_in_use``,
by location: device / pinned host / pageable host), the process RSS (CPU) or allocated CUDA /
pinned-host bytes (GPU), each as a delta from before the first group. Then every group is closed
and ``finish`` (the barrier) runs; its ``StreamingReport.peak_bytes`` is recorded.

Part 2, through the strategy (a real ``Trainer.fit`` with ``ThunderSyncStrategy`` on the
trace-replay engine replaying ``paper_tail``, ``--strategy-time-scale`` seconds per unit):
``StepStats.accumulator`` (peak bytes of the step) and the most open groups (``StepStats.open_groups``) for
several ``max_open_groups`` bounds and offload modes. Here a trajectory whose content lands before its reward
is backpropagated early and its gradient *held* (one more buffer until the reward arrives), so the peak can
exceed 2 x P x 4 per open group; the ratio is reported.

Offload ``pinned`` is measured only where CUDA is available (a CPU build cannot pin memory).

The planner (``thundersync_lightning.planning.memory_plan``) is compared with both parts: in part 1 its
``group sums`` row for the open groups against the RSS growth; in part 2 its accumulator rows (group
sums + held gradients + step gradient, an upper bound) against the measured peak, with the
held-gradient bound ``max_held_trajectories`` (``--held-bound``).

Usage: python benchmarks/memory.py [--quick] [--out DIR] [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import psutil  # noqa: E402
import torch  # noqa: E402

from _common import add_common_args, write_result  # noqa: E402
from _harness import fit, load_average, qwen3_config  # noqa: E402
from thundersync_lightning.core.accumulator.streaming import StreamingGRPO  # noqa: E402
from thundersync_lightning.core.types import Segment, Trajectory  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.planning.memory_plan import ModelShape, PlanInputs, plan_memory  # noqa: E402
from thundersync_lightning.rollout import TraceReplayEngineConfig  # noqa: E402

NAME = "memory"
ACCUMULATOR_ROWS = ("group sums", "held gradients", "step gradient")


def planned(num_params: int, device: torch.device, **kw: Any) -> Any:
    """The planner's plan for an fp32 model of ``num_params`` trainable parameters on ``device``."""
    accelerator = "gpu" if device.type == "cuda" else "cpu"
    return plan_memory(PlanInputs(ModelShape(num_params, num_params, 4), accelerator=accelerator, **kw))


#: name -> (hidden, intermediate, layers, vocab)
SIZES = {
    "S": (64, 256, 2, 256),
    "M": (256, 1024, 4, 1024),
    "L": (512, 2048, 8, 4096),
}


def _trajectory(tid: str, gid: str, k: int, vocab: int, seed: int) -> Trajectory:
    gen = torch.Generator().manual_seed(seed)
    tokens = tuple(int(x) for x in torch.randint(0, vocab, (12,), generator=gen))
    return Trajectory(
        trajectory_id=tid,
        group_id=gid,
        sample=k,
        prompt=tokens[:4],
        segments=(Segment(tokens[4:], scored=True),),
        policy_version=0,
        num_turns=1,
        finish_reason="submit",
        submitted_at=0.0,
        content_ready_at=0.0,
    )


def _rss() -> int:
    return psutil.Process().memory_info().rss


def _device_bytes(device: torch.device) -> dict[str, int]:
    if device.type != "cuda":
        return {"rss": _rss()}
    out = {"rss": _rss(), "cuda_allocated": torch.cuda.memory_allocated(device)}
    if hasattr(torch.cuda, "host_memory_stats"):
        out["pinned_host_active"] = int(torch.cuda.host_memory_stats().get("active_bytes.current", 0))
    return out


def accumulator_curve(size: str, offload: str, max_groups: int, device: torch.device) -> dict[str, Any]:
    hidden, inter, layers, vocab = SIZES[size]
    torch.manual_seed(0)
    policy = GRPOPolicy(config=qwen3_config(hidden, inter, layers, vocab)).to(device)
    params = [p for p in policy.parameters() if p.requires_grad]
    P = sum(p.numel() for p in params)
    buffer = 4 * P
    warm = _trajectory("warm", "warm", 0, vocab, seed=0)  # one untimed backward: autograd's own allocations
    torch.autograd.grad(policy.trajectory_logprobs([warm])[0], params)
    acc = StreamingGRPO(params, offload=offload)
    gc.collect()
    before = _device_bytes(device)
    curve = []
    groups = []
    for g in range(max_groups):
        gid = f"g{g}"
        ids = [f"{gid}-t{k}" for k in range(3)]
        trajs = [_trajectory(t, gid, k, vocab, seed=100 * g + k) for k, t in enumerate(ids)]
        acc.open_group(gid, ids)
        for k, reward in ((0, 1.0), (1, 0.0)):
            acc.add_reward(ids[k], reward)
            acc.add_logprob(ids[k], policy.trajectory_logprobs([trajs[k]])[0])  # a new sum per reward value
        groups.append((ids, trajs))
        gc.collect()
        now = _device_bytes(device)
        use = acc.bytes_in_use
        curve.append(
            {
                "open_groups": len(acc.open_groups),
                "analytic_bytes": 2 * buffer * len(acc.open_groups),
                "accumulator_bytes": {
                    "device": use.device,
                    "pinned_host": use.pinned_host,
                    "pageable_host": use.pageable_host,
                },
                "accumulator_total_bytes": use.total,
                "measured_delta_bytes": {k: now[k] - before[k] for k in now},
            }
        )
    for ids, trajs in groups:  # close: the third reward folds the sums, its logprob goes direct
        acc.add_reward(ids[2], 1.0)
        acc.add_logprob(ids[2], policy.trajectory_logprobs([trajs[2]])[0])
    report = acc.finish()
    peak = report.peak_bytes
    last = curve[-1]
    # every group open, two rewarded trajectories each (the third is scored after the snapshot, nothing held)
    plan_sums = (
        planned(P, device, groups_per_step=max_groups, group_size=3, max_held_trajectories=0)
        .row("group sums")
        .total
    )
    out = {
        "size": size,
        "offload": offload,
        "num_params": P,
        "buffer_bytes": buffer,
        "config": qwen3_config(hidden, inter, layers, vocab),
        "curve": curve,
        "ratio_accounted_over_analytic": last["accumulator_total_bytes"] / last["analytic_bytes"],
        "ratio_rss_over_analytic": last["measured_delta_bytes"]["rss"] / last["analytic_bytes"],
        "peak_bytes": {
            "device": peak.device,
            "pinned_host": peak.pinned_host,
            "pageable_host": peak.pageable_host,
        },
        "peak_total_bytes": peak.total,
        "peak_over_analytic_max_groups": peak.total / (2 * buffer * max_groups),
        "backward_passes": report.backward_passes,
        "planned_group_sums_bytes": plan_sums,
        "ratio_rss_over_planned": last["measured_delta_bytes"]["rss"] / plan_sums,
    }
    if device.type == "cuda":
        out["ratio_cuda_allocated_over_analytic"] = (
            last["measured_delta_bytes"]["cuda_allocated"] / last["analytic_bytes"]
        )
    del acc, policy, params, groups
    gc.collect()
    return out


def strategy_run(
    size: str,
    offload: str,
    max_open: int | None,
    steps: int,
    device: torch.device,
    groups: int,
    group_size: int,
    time_scale_s: float,
    held_bound: int | None = None,
) -> dict[str, Any]:
    hidden, inter, layers, vocab = SIZES[size]
    torch.manual_seed(0)
    policy = GRPOPolicy(config=qwen3_config(hidden, inter, layers, vocab))
    P = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=TraceReplayEngineConfig(time_scale_s=time_scale_s),
        group_size=group_size,
        groups_per_step=groups,
        seed=0,
    )
    record = fit(
        "streaming",
        policy,
        data,
        steps,
        device=device.type,
        offload=offload,
        max_open_groups=max_open,
        max_held_trajectories=held_bound,
    )
    plan = planned(
        P,
        device,
        groups_per_step=groups,
        group_size=group_size,
        max_open_groups=max_open,
        max_held_trajectories=held_bound,
        offload=offload,
    )
    plan_acc = plan.bytes_of(*ACCUMULATOR_ROWS)
    rows = []
    for s in record.steps:
        most_open = max((n for _, n in s.open_groups), default=0)
        acc = s.accumulator
        rows.append(
            {
                "step": s.step,
                "max_open_groups_seen": most_open,
                "accumulator_peak_bytes": {
                    "device": acc.device,
                    "pinned_host": acc.pinned_host,
                    "pageable_host": acc.pageable_host,
                },
                "accumulator_peak_total_bytes": acc.total,
                "analytic_bytes_at_most_open": 2 * 4 * P * most_open,
            }
        )
    worst = max(rows, key=lambda r: r["accumulator_peak_total_bytes"])
    return {
        "size": size,
        "offload": offload,
        "max_open_groups": max_open,
        "num_params": P,
        "steps": rows,
        "peak_total_bytes": worst["accumulator_peak_total_bytes"],
        "max_open_groups_seen": max(r["max_open_groups_seen"] for r in rows),
        "peak_over_analytic": worst["accumulator_peak_total_bytes"]
        / max(1, worst["analytic_bytes_at_most_open"]),
        "peak_in_buffers": worst["accumulator_peak_total_bytes"] / (4 * P),
        "max_held_trajectories": held_bound,
        "planned_held_trajectories": plan.inputs.held_trajectories,
        "planned_accumulator_bytes": plan_acc,
        "peak_over_planned": worst["accumulator_peak_total_bytes"] / plan_acc,
    }


def figure(path: str, curves: list[dict], runs: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2), dpi=100)
    markers = {"none": "o", "cpu": "s", "pinned": "^"}
    colors = {"S": "tab:blue", "M": "tab:orange", "L": "tab:green"}
    for c in curves:
        xs = [p["open_groups"] for p in c["curve"]]
        label = f"{c['size']} ({c['num_params'] / 1e6:.2f}M) offload={c['offload']}"
        axes[0].plot(
            xs,
            [p["accumulator_total_bytes"] / 2**20 for p in c["curve"]],
            marker=markers[c["offload"]],
            color=colors[c["size"]],
            label=label,
            linestyle="-" if c["offload"] == "none" else ":",
        )
        axes[0].plot(
            xs, [p["analytic_bytes"] / 2**20 for p in c["curve"]], color="k", linewidth=0.6, alpha=0.5
        )
        axes[1].plot(
            xs,
            [
                p["measured_delta_bytes"].get("cuda_allocated", p["measured_delta_bytes"]["rss"])
                / p["analytic_bytes"]
                for p in c["curve"]
            ],
            marker=markers[c["offload"]],
            color=colors[c["size"]],
            label=label,
            linestyle="-" if c["offload"] == "none" else ":",
        )
    axes[0].set_yscale("log")
    axes[0].set_xlabel("open groups")
    axes[0].set_ylabel("accumulator MiB (accounted); black: 2 x P x 4 x groups")
    axes[0].set_title("StreamingGRPO bytes vs open groups", fontsize=9)
    axes[1].axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    axes[1].set_xlabel("open groups")
    axes[1].set_ylabel("measured delta / analytic")
    axes[1].set_title("measured (RSS on CPU, CUDA allocated on GPU) over analytic", fontsize=9)
    axes[1].set_ylim(0, 2)
    labels = [f"{r['size']} {r['offload']}\nmax_open={r['max_open_groups']}" for r in runs]
    x = range(len(runs))
    worst = [max(r["steps"], key=lambda s: s["accumulator_peak_total_bytes"]) for r in runs]
    dev = [w["accumulator_peak_bytes"]["device"] / 2**20 for w in worst]
    pin = [w["accumulator_peak_bytes"]["pinned_host"] / 2**20 for w in worst]
    page = [w["accumulator_peak_bytes"]["pageable_host"] / 2**20 for w in worst]
    axes[2].bar(x, dev, label="device", color="tab:red")
    axes[2].bar(x, pin, bottom=dev, label="pinned host", color="tab:purple")
    axes[2].bar(x, page, bottom=[a + b for a, b in zip(dev, pin)], label="pageable host", color="tab:gray")
    axes[2].scatter(
        x,
        [w["analytic_bytes_at_most_open"] / 2**20 for w in worst],
        color="k",
        marker="_",
        s=300,
        label="2xPx4 x most open groups",
        zorder=3,
    )
    axes[2].set_xticks(list(x), labels, fontsize=6)
    axes[2].set_ylabel("peak MiB (StepStats.accumulator)")
    axes[2].set_title("through the strategy: peak by location", fontsize=9)
    for ax in axes:
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)  # 2 OpenMP threads stall on a shared 2-core VM (README)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--sizes", nargs="+", default=None, choices=list(SIZES), help="(default S M L, quick S M)"
    )
    parser.add_argument("--max-groups", type=int, default=8, help="groups opened in part 1")
    parser.add_argument("--offloads", nargs="+", default=None, help="(default none cpu, plus pinned on CUDA)")
    parser.add_argument("--strategy-steps", type=int, default=2)
    parser.add_argument("--strategy-groups", type=int, default=8)
    parser.add_argument("--strategy-group-size", type=int, default=4)
    parser.add_argument("--strategy-size", default="S", choices=list(SIZES))
    parser.add_argument(
        "--strategy-time-scale", type=float, default=0.005, help="paper_tail seconds per unit"
    )
    parser.add_argument(
        "--strategy-bounds",
        nargs="+",
        default=None,
        help="max_open_groups values, 0 = none (default 0 8 4 2 1, quick 0 4 1)",
    )
    parser.add_argument(
        "--held-bound", type=int, default=4, help="max_held_trajectories of part 2 (0: unbounded)"
    )
    parser.add_argument(
        "--large", default=None, help="override size L as HIDDEN,INTERMEDIATE,LAYERS,VOCAB (GPU runs)"
    )
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    if args.large:
        SIZES["L"] = tuple(int(x) for x in args.large.split(","))  # type: ignore[assignment]
    sizes = args.sizes or (["S", "M"] if args.quick else ["S", "M", "L"])
    offloads = args.offloads or (["none", "cpu", "pinned"] if torch.cuda.is_available() else ["none", "cpu"])
    torch.set_num_threads(args.threads)
    load_start = load_average()

    curves = []
    for size in sizes:
        for offload in offloads:
            c = accumulator_curve(size, offload, args.max_groups, device)
            curves.append(c)
            print(
                f"part 1 {size} ({c['num_params'] / 1e6:.2f}M params) offload={offload}: {args.max_groups} "
                f"open groups accounted/analytic {c['ratio_accounted_over_analytic']:.3f}, RSS "
                f"delta/analytic {c['ratio_rss_over_analytic']:.3f}, barrier peak "
                f"{c['peak_total_bytes'] / 2**20:.1f} MiB "
                f"({c['peak_over_analytic_max_groups']:.3f} x analytic)",
                flush=True,
            )
    runs = []
    raw = args.strategy_bounds or (["0", "4", "1"] if args.quick else ["0", "8", "4", "2", "1"])
    bounds = [int(b) or None for b in raw]
    for offload in offloads:
        for bound in bounds if offload == "none" else [None]:
            r = strategy_run(
                args.strategy_size,
                offload,
                bound,
                args.strategy_steps,
                device,
                args.strategy_groups,
                args.strategy_group_size,
                args.strategy_time_scale,
                args.held_bound or None,
            )
            runs.append(r)
            print(
                f"part 2 {args.strategy_size} offload={offload} max_open_groups={bound}: peak "
                f"{r['peak_total_bytes'] / 2**20:.2f} MiB = {r['peak_in_buffers']:.1f} buffers, most open "
                f"groups {r['max_open_groups_seen']}, peak/analytic {r['peak_over_analytic']:.2f}, "
                f"peak/planned {r['peak_over_planned']:.2f} "
                f"(max_held_trajectories={r['max_held_trajectories']})",
                flush=True,
            )
    results = {
        "description": (
            "streaming accumulator bytes vs open groups, offload and model size, vs 2 x P x 4 per open group"
        ),
        "analytic": (
            "2 x P x 4 bytes per open group (two float32 sums; binary rewards), plus while folding "
            "one P x 4 step gradient on the device and one in-flight flat gradient"
        ),
        "accumulator": curves,
        "strategy": runs,
        "summary": {
            "accounted_over_analytic": {
                f"{c['size']}/{c['offload']}": c["ratio_accounted_over_analytic"] for c in curves
            },
            "rss_over_analytic": {
                f"{c['size']}/{c['offload']}": c["ratio_rss_over_analytic"] for c in curves
            },
            "barrier_peak_over_analytic": {
                f"{c['size']}/{c['offload']}": c["peak_over_analytic_max_groups"] for c in curves
            },
            "strategy_peak_over_analytic": {
                f"{r['offload']}/max_open={r['max_open_groups']}": r["peak_over_analytic"] for r in runs
            },
            "strategy_peak_buffers": {
                f"{r['offload']}/max_open={r['max_open_groups']}": r["peak_in_buffers"] for r in runs
            },
            "rss_over_planned": {f"{c['size']}/{c['offload']}": c["ratio_rss_over_planned"] for c in curves},
            "strategy_peak_over_planned": {
                f"{r['offload']}/max_open={r['max_open_groups']}": r["peak_over_planned"] for r in runs
            },
            "held_bound": args.held_bound or None,
        },
        "strategy_workload": {
            "engine": f"TraceReplayEngineConfig(trace='paper_tail', time_scale_s={args.strategy_time_scale})",
            "size": args.strategy_size,
            "groups": args.strategy_groups,
            "group_size": args.strategy_group_size,
            "steps": args.strategy_steps,
            "mode": "streaming",
        },
        "device": args.device,
        "threads": args.threads,
        "quick": args.quick,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    if device.type == "cuda":
        results["peak_vram_bytes"] = int(torch.cuda.max_memory_allocated(device))
    path = write_result(args.out, NAME, results)
    figure(str(path.with_suffix(".png")), curves, runs)
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
