"""Synchronous vs streaming vs one-step-async GRPO on one workload, against the physical bound.

The learner is the project's real one: a Lightning ``Trainer`` with ``ThunderSyncStrategy`` in each
mode, a randomly initialised Qwen3 ``GRPOPolicy`` doing its real forward and backward passes on
CPU (or CUDA), and the trace-replay engine (``TraceReplayEngineConfig``) replaying the shipped
``paper_tail`` trace: long-tailed rollouts calibrated so that a synchronous learner that spends one
trace unit per trajectory idles 49.5% of each step (the paper's measurement).

Calibration (before any mode runs): the cost of the learner's backward is measured on the real
trajectories of up to ``--calibration-batches`` of the batches the runs will measure, both ways the
strategy runs it:

    single   one trajectory scored and backpropagated into StreamingGRPO (the streaming path
             when its reward is not known yet: its gradient is held),
    sync     the synchronous path: one forward of grpo_loss over the whole padded batch and
             one backward, divided by the number of trajectories.

``time_scale_s`` (seconds per trace unit) is set to one of them (``--calibrate``, default
``sync``: then the synchronous learner does B*G units of work per step, as the trace assumes, and
its idle fraction reproduces ~49.5%).

Modes run INTERLEAVED: round r runs one block of ``--steps`` steps of each mode (a fresh ``fit``
each with rollout seed ``--seed + r``, so within a round every mode replays exactly the same trace
rows, and rounds cover different rows of the long tail), the order rotating every round, so slow
phases of a shared machine hit every mode alike. The first ``--warmup`` steps of every block are
not measured (no rollout was launched ahead of step 0; async's step 1 trains on rollouts that had
all of step 0 to finish).

Every mode runs the same multiset of (seed, step) workloads. The headline speedups are ratios of
MEDIAN step times (robust on a shared machine); ``throughput`` holds the same ratios with MEAN step
times (= throughput ratios). The makespan is heavy-tailed, so the two differ even for a perfect
learner: ``trace_ceiling`` gives both for a learner that costs one unit per trajectory, over 400
trace steps (sync = makespan + B*G units, perfect streaming = max(makespan, B*G units)).

Per mode: step time = time between consecutive step ends (Lightning's own overhead included),
learner idle fraction = 1 - busy / step time, MFU = 6 N T / (step time x peak) with N the
parameters that take part in matmuls (all but the input embedding), T the tokens the learner
ran forward+backward on (real tokens, not padding) and peak the best rate of a 1024^3 float32
matmul on this machine with the same threads (stated in the JSON).

The lower bound of a step (per measured (seed, step) k, then median / mean like the step times):

    bound_k = max(M_k * time_scale_s + c_single + end_of_step,
                  max_j (c_j * time_scale_s + W_k * T_{>=j} / T) + end_of_step)

M_k: the step's rollout makespan in trace units (the last reward), c_single: one trajectory's
streaming backward (the last one can only start when it lands), end_of_step: the barrier, the
optimizer step and the weight publish (streaming's measured medians), W_k: step k's learner work
done the cheapest way measured (the smaller of the synchronous and the streaming learner's busy
seconds on that very step: steps differ in tokens), c_j: trajectory j's content_ready (units),
T_{>=j} / T: the share of the step's tokens in trajectories whose content lands at c_j or later.
The second term is the single-machine bound with release dates: no learner, however it batches,
works on a trajectory before its content lands, and the barrier follows the last of that work.
``without_release_dates`` reports the bound of earlier runs (``max(M_k s + c_single +
end_of_step, W)`` with W the median work over all steps).
``bound_speedup`` = sync step / bound, ``efficiency`` = streaming's speedup / bound_speedup.

Workloads (``--workload``, :mod:`_workloads`): ``short`` (default; the numbers above) and ``long``
(a 20M-parameter model, ~500-2000-token trajectories, compute-bound backward passes; calibrated
with ``balance``: the time scale at which the synchronous learner idles 49.5% at this batch).
``long`` writes ``overlap_long.json``.

Environment set-up (``--setup-fraction f``): every trajectory first spends f x its generation time
creating its environment; ``--prepare-ahead`` (default) lets the strategy hand step k+1 to the
engine when step k starts (``ThunderSyncStrategy(prepare_ahead=True)``), ``--no-prepare-ahead``
does not. The bound ignores set-up (what a perfect prefetch allows).

Usage: python benchmarks/overlap.py [--quick] [--workload short|long] [--out DIR] [--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _common import add_common_args, write_result  # noqa: E402
from _harness import (  # noqa: E402
    MODES,
    fit,
    load_average,
    matmul_params,
    peak_flops,
    qwen3_config,
    trace_schedule,
)
from _workloads import WORKLOADS, balance_time_scale  # noqa: E402
from thundersync_lightning.core.streaming import StreamingGRPO  # noqa: E402
from thundersync_lightning.core.types import ContentReady, GroupRequest, RewardReady, RolloutRequest  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.rollout import TraceReplayEngineConfig  # noqa: E402
from thundersync_lightning.rollout.replay import TraceReplayEngine, sync_idle_fraction  # noqa: E402

NAME = "overlap"
TARGETS = {  # issue 16, per workload
    "short": {"efficiency": 0.97, "streaming_over_sync_learner_work_max": 1.02},
    "long": {
        "efficiency": 0.97,
        "streaming_throughput_over_async": 0.95,
        "streaming_over_sync_learner_work_max": 1.02,
    },
}
END_OF_STEP = ("barrier", "optimizer", "publish")


# ---------------------------------------------------------------------------------------- set-up
def make_policy(args: argparse.Namespace) -> GRPOPolicy:
    torch.manual_seed(0)
    return GRPOPolicy(config=model_config(args), lr=1e-5, score_max_padding=args.score_max_padding)


def model_config(args: argparse.Namespace) -> dict:
    return qwen3_config(args.hidden, args.intermediate, args.layers, args.vocab, args.max_positions)


def engine_config(args: argparse.Namespace, time_scale_s: float, slots: int | None) -> TraceReplayEngineConfig:
    return TraceReplayEngineConfig(
        trace=args.trace,
        time_scale_s=time_scale_s,
        prompt_tokens=args.prompt_tokens,
        rollout_slots=slots,
        token_scale=args.token_scale,
        setup_fraction=args.setup_fraction,
    )


def make_data(args: argparse.Namespace, time_scale_s: float, seed: int) -> RolloutDataModule:
    return RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),  # payloads only; the replay engine draws the tokens
        engine=engine_config(args, time_scale_s, args.rollout_slots or None),
        group_size=args.group_size,
        groups_per_step=args.groups,
        seed=seed,
    )


def calibrate(
    args: argparse.Namespace, device: torch.device, workloads: list[tuple[int, int]]
) -> dict[str, Any]:
    """Seconds of the learner's backward per trajectory, streaming-single and sync-batched, on the
    real trajectories of the (seed, step) batches the runs will measure (the engine draws them; no
    waiting: time scale ~0). The sync cost depends on each batch's longest trajectory (padding), so
    it is averaged over the batches: total seconds / total trajectories."""
    policy = make_policy(args).to(device)
    params = [p for p in policy.parameters() if p.requires_grad]
    batches = []
    for seed, step in workloads:
        engine = TraceReplayEngine(policy.model_spec, replace(engine_config(args, 1e-9, None), setup_fraction=0.0))
        engine.publish({}, 0)
        request = RolloutRequest(
            step=step,
            groups=tuple(GroupRequest(f"s{step}-g{g}", g, None, args.group_size) for g in range(args.groups)),
            seed=seed,
        )
        events = list(engine.rollout(request))
        trajectories = [e.trajectory for e in events if isinstance(e, ContentReady)]
        rewards = {e.trajectory_id: e.reward for e in events if isinstance(e, RewardReady)}
        batches.append((trajectories, [rewards[t.trajectory_id] for t in trajectories]))

    def sync_once(trajectories: list, rewards: list) -> float:
        for p in params:
            p.grad = None
        start = time.perf_counter()
        loss = policy.grpo_loss(trajectories, rewards)
        loss.backward()
        _sync(device)
        return time.perf_counter() - start

    def single_once(t: Any) -> float:
        acc = StreamingGRPO(params)
        acc.open_group("g", [t.trajectory_id, "other"])
        start = time.perf_counter()
        acc.add_logprobs([t.trajectory_id], policy.trajectory_logprobs([t]))  # reward unknown: held
        _sync(device)
        return time.perf_counter() - start

    per_batch = max(1, args.calibration_samples // len(batches))
    samples = [
        t
        for trajectories, _ in batches
        for t in trajectories[:: max(1, len(trajectories) // per_batch)][:per_batch]
    ]
    for t in samples[:2]:
        single_once(t)  # warm-up
    sync_once(*batches[0])
    singles: list[float] = []
    sync_seconds = [0.0] * len(batches)
    for _rep in range(args.calibration_reps):  # interleaved: the sync batches, then the singles
        for i, batch in enumerate(batches):
            sync_seconds[i] += sync_once(*batch)
        singles.extend(single_once(t) for t in samples)
    for p in params:
        p.grad = None
    n = sum(len(b[0]) for b in batches)
    lengths = [len(t.tokens) for b in batches for t in b[0]]
    padded = sum(len(b[0]) * max(len(t.tokens) for t in b[0]) for b in batches)
    return {
        "workloads": [list(w) for w in workloads],
        "single_s": statistics.median(singles),
        "single_samples_s": singles,
        "sync_per_trajectory_s": sum(sync_seconds) / (n * args.calibration_reps),
        "sync_per_trajectory_by_batch_s": [
            x / (len(b[0]) * args.calibration_reps) for x, b in zip(sync_seconds, batches)
        ],
        "trajectories": n,
        "tokens_mean": statistics.mean(lengths),
        "tokens_min": min(lengths),
        "tokens_max": max(lengths),
        "sync_work_per_step_s": sum(sync_seconds) / (len(batches) * args.calibration_reps),
        "padding_factor_sync": padded / sum(lengths),
        "sample_mean_tokens": statistics.mean(len(t.tokens) for t in samples),
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------------------- runs
def run_block(
    args: argparse.Namespace, mode: str, time_scale_s: float, device: torch.device, seed: int
) -> dict:
    policy = make_policy(args)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    started = time.monotonic()
    cpu = time.process_time()  # robust to other jobs on the machine, unlike the wall-clock busy time
    record = fit(
        mode,
        policy,
        make_data(args, time_scale_s, seed),
        args.steps,
        device=device.type,
        max_batch_trajectories=args.max_batch_trajectories,
        max_open_groups=args.max_open_groups,
        offload=args.offload,
        prepare_ahead=args.prepare_ahead,
    )
    out = {
        "mode": mode,
        "seed": seed,
        "steps": record.steps,
        "fit_seconds": time.monotonic() - started,
        "cpu_seconds": time.process_time() - cpu,
    }
    if device.type == "cuda":
        out["peak_vram_bytes"] = int(torch.cuda.max_memory_allocated(device))
    return out


def step_rows(
    block: dict, args: argparse.Namespace, n_matmul: int, peak: float, time_scale_s: float
) -> list[dict]:
    """Per measured step: period (previous step end -> this end), busy by kind, idle, MFU, and how
    long before the step started its rollouts began generating (the head start)."""
    steps = block["steps"]
    rows = []
    for i in range(max(1, args.warmup), len(steps)):
        s, prev = steps[i], steps[i - 1]
        sched = trace_schedule(args.trace, block["seed"], s.step, args.groups, args.group_size)
        gen_start = min(
            r.content_ready_at - sched[_index(r.trajectory_id, args.group_size)][0] * time_scale_s
            for r in s.trajectories
        )
        period = s.step_end - prev.step_end
        kinds: dict[str, float] = {}
        for iv in s.busy:
            kinds[iv.kind] = kinds.get(iv.kind, 0.0) + iv.seconds
        busy = sum(kinds.values())
        backward_calls = sum(1 for iv in s.busy if iv.kind == "backward")
        rows.append(
            {
                "seed": block["seed"],
                "step": s.step,
                "period_s": period,
                "wall_s": s.wall_seconds,
                "busy_s": busy,
                "busy_by_kind_s": kinds,
                "idle_fraction": max(0.0, 1.0 - busy / period),
                "strategy_idle_fraction": s.idle_fraction,
                "learner_tokens": s.learner_tokens,
                "mfu": 6 * n_matmul * s.learner_tokens / (period * peak),
                "staleness_max": s.staleness_max,
                "backward_calls": backward_calls,
                "accumulator_peak_bytes": s.accumulator.total,
                "rollout_head_start_s": prev.step_end - gen_start,
                # (content_ready in trace units, tokens) per trajectory: the release-date bound
                "arrivals": sorted(
                    (sched[_index(r.trajectory_id, args.group_size)][0], r.num_tokens) for r in s.trajectories
                ),
            }
        )
    return rows


def release_bound(arrivals: list[tuple[float, int]], time_scale_s: float, work_s: float) -> float:
    """Least time to finish a step's learner work when no trajectory can be worked on before its
    content lands: ``max_j (c_j s + W * tokens(c >= c_j) / tokens)`` over arrivals c_j (units, x s
    seconds), W the step's learner work split over trajectories in proportion to their tokens (the
    single-machine bound with release dates, every job at its cheapest measured rate)."""
    total = sum(n for _, n in arrivals)
    best, after = 0.0, total
    for c, n in sorted(arrivals):
        best = max(best, c * time_scale_s + work_s * after / total)
        after -= n
    return best


def _index(trajectory_id: str, group_size: int) -> int:
    """Position of "s{step}-g{g}-t{k}" in trace_schedule's order."""
    g, k = (int(part[1:]) for part in trajectory_id.split("-")[1:])
    return g * group_size + k


def med(rows: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def summarise(rows: list[dict], blocks: list[dict], args: argparse.Namespace) -> dict:
    trajectories = args.groups * args.group_size
    kinds = sorted({k for r in rows for k in r["busy_by_kind_s"]})
    out = {
        "median_step_s": med(rows, "period_s"),
        "mean_step_s": statistics.mean(r["period_s"] for r in rows),
        "learner_idle_fraction": med(rows, "idle_fraction"),
        "mfu": med(rows, "mfu"),
        "staleness_max": max(s.staleness_max for b in blocks for s in b["steps"]),
        "throughput_trajectories_per_s": trajectories / statistics.mean(r["period_s"] for r in rows),
        "measured_steps": len(rows),
        "step_s": [r["period_s"] for r in rows],
        "strategy_idle_fraction": med(rows, "strategy_idle_fraction"),
        "busy_s": med(rows, "busy_s"),
        "busy_by_kind_median_s": {
            k: statistics.median(r["busy_by_kind_s"].get(k, 0.0) for r in rows) for k in kinds
        },
        "backward_calls_median": med(rows, "backward_calls"),
        "trajectories_per_backward_call": trajectories / max(1.0, med(rows, "backward_calls")),
        "accumulator_peak_bytes_max": max(r["accumulator_peak_bytes"] for r in rows),
        "rollout_head_start_median_s": med(rows, "rollout_head_start_s"),
        "fit_seconds": [b["fit_seconds"] for b in blocks],
        "cpu_seconds_per_step": sum(b["cpu_seconds"] for b in blocks) / sum(len(b["steps"]) for b in blocks),
    }
    if any("peak_vram_bytes" in b for b in blocks):
        out["peak_vram_bytes"] = max(b.get("peak_vram_bytes", 0) for b in blocks)
    return out


def targets_met(
    targets: dict[str, float], efficiency: float, over_async: float, diagnosis: dict, modes: dict
) -> dict[str, bool]:
    """Each of the workload's targets (issue 16), plus staleness 0 in streaming."""
    met = {"efficiency": efficiency >= targets["efficiency"], "streaming_staleness_0": modes["streaming"]["staleness_max"] == 0}
    if "streaming_throughput_over_async" in targets:
        met["streaming_throughput_over_async"] = over_async >= targets["streaming_throughput_over_async"]
    met["streaming_over_sync_learner_work"] = (
        diagnosis["streaming_over_sync_learner_work"] <= targets["streaming_over_sync_learner_work_max"]
    )
    return met


# ---------------------------------------------------------------------------------------- figure
def timeline_png(
    path: str, blocks: dict[str, dict], args: argparse.Namespace, time_scale_s: float, results: dict
) -> None:
    """One row per mode: each trajectory's rollout (generation, then verdict wait) above, the
    learner's busy intervals below (white gaps = idle), for two consecutive measured steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    kind_colors = {
        "backward": "tab:green",
        "fold": "tab:olive",
        "barrier": "tab:red",
        "optimizer": "tab:purple",
        "publish": "tab:brown",
    }
    first = max(1, args.warmup)
    shown = list(range(first, min(first + 2, args.steps)))
    fig, axes = plt.subplots(len(MODES), 1, figsize=(12, 2.6 * len(MODES)), sharex=True, dpi=100)
    xmax = 0.0
    xmin = 0.0
    for ax, mode in zip(axes, MODES):
        steps = blocks[mode]["steps"]
        t0 = steps[shown[0] - 1].step_end  # the previous step's end: where the first shown step begins
        n_traj = args.groups * args.group_size
        lane = 0
        for k in shown:
            s = steps[k]
            sched = trace_schedule(args.trace, blocks[mode]["seed"], s.step, args.groups, args.group_size)
            recs = sorted(s.trajectories, key=lambda r: r.reward_ready_at or r.content_ready_at)
            for j, r in enumerate(recs):
                gen_units = sched[_index(r.trajectory_id, args.group_size)][0]
                y = 1.0 + lane + (j + 0.5) / n_traj
                gen0 = r.content_ready_at - gen_units * time_scale_s - t0
                xmin = min(xmin, gen0)
                ax.hlines(y, gen0, r.content_ready_at - t0, color="tab:blue", linewidth=0.6, alpha=0.8)
                if r.reward_ready_at is not None:
                    ax.hlines(
                        y,
                        r.content_ready_at - t0,
                        r.reward_ready_at - t0,
                        color="tab:orange",
                        linewidth=0.6,
                        alpha=0.8,
                    )
            lane += 1
            ax.axvline(s.step_end - t0, color="k", linestyle=":", linewidth=0.8)
            for iv in s.busy:
                ax.broken_barh(
                    [(iv.start - t0, iv.seconds)], (0.1, 0.7), color=kind_colors.get(iv.kind, "gray")
                )
            xmax = max(xmax, s.step_end - t0)
        ax.broken_barh(
            [(0, steps[shown[-1]].step_end - t0)],
            (0.1, 0.7),
            facecolor="none",
            edgecolor="0.6",
            hatch="//",
            linewidth=0.3,
            zorder=0,
        )
        r = results["modes"][mode]
        ax.set_yticks([0.45, 2.0], ["learner", "rollouts"])
        ax.set_ylim(0, 3.1)
        ax.set_title(
            f"{mode}: median step {r['median_step_s']:.2f} s, learner idle {r['learner_idle_fraction']:.0%}, "
            f"MFU {r['mfu']:.1%}, staleness max {r['staleness_max']}",
            fontsize=9,
            loc="left",
        )
    axes[-1].set_xlim(xmin - 0.01 * xmax, xmax * 1.01)
    axes[-1].set_xlabel(
        "seconds from the end of the step before (two consecutive steps; dotted: step end; hatched: learner idle; "
        "async's rollouts start before 0: issued one step ahead)"
    )
    handles = [
        Patch(color="tab:blue", label="generation (content ready)"),
        Patch(color="tab:orange", label="verdict wait (reward ready)"),
        *[Patch(color=c, label=k) for k, c in kind_colors.items()],
    ]
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=7, fontsize=7)
    fig.suptitle(
        f"streaming {results['speedup_streaming_vs_sync']:.2f}x sync, async {results['speedup_async_vs_sync']:.2f}x, "
        f"bound {results['bound_speedup']:.2f}x, efficiency {results['efficiency']:.2f} "
        f"(trace {args.trace}, {args.groups}x{args.group_size}, 1 unit = {time_scale_s * 1e3:.1f} ms)",
        fontsize=10,
        x=0.01,
        ha="left",
    )
    fig.tight_layout(rect=(0, 0, 1, 0.91))
    fig.savefig(path)
    plt.close(fig)


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)  # 2 OpenMP threads stall on a shared 2-core VM (README)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--workload", default="short", choices=sorted(WORKLOADS), help="model and trajectory shape (_workloads.py)"
    )
    parser.add_argument("--name", default=None, help="output name (default overlap; overlap_long for long)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 4, quick 2; long quick 1)")
    parser.add_argument("--steps", type=int, default=None, help="steps per block (default 5, quick 4; long quick 3)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps at the start of every block")
    parser.add_argument("--groups", type=int, default=None, help="B, groups per step (default 16; long quick 4)")
    parser.add_argument("--group-size", type=int, default=None, help="G (default 8; long quick 2)")
    parser.add_argument("--hidden", type=int, default=None, help="Qwen3 hidden size (workload's)")
    parser.add_argument("--intermediate", type=int, default=None, help="(workload's)")
    parser.add_argument("--layers", type=int, default=None, help="(workload's)")
    parser.add_argument("--vocab", type=int, default=None, help="(workload's)")
    parser.add_argument("--trace", default="paper_tail")
    parser.add_argument(
        "--prompt-tokens", type=int, default=None, help="unscored prompt tokens per trajectory (workload's)"
    )
    parser.add_argument("--token-scale", type=float, default=None, help="x the trace's scored tokens (workload's)")
    parser.add_argument(
        "--setup-fraction", type=float, default=0.0, help="environment set-up, x each trajectory's generation time"
    )
    parser.add_argument(
        "--prepare-ahead",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ThunderSyncStrategy(prepare_ahead=...): set-up of step k+1 during step k",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rollout-slots",
        type=int,
        default=None,
        help="trajectories the rollout fleet runs at once (default B*G: a saturated fleet, as in the "
        "paper; 0: unlimited, which lets async start a whole batch early)",
    )
    parser.add_argument(
        "--calibrate",
        choices=["sync", "single", "balance"],
        default=None,
        help="what one trace unit is (short: sync, long: balance = sync idle 49.5%% at this batch)",
    )
    parser.add_argument(
        "--time-scale", type=float, default=None, help="seconds per trace unit (skips --calibrate)"
    )
    parser.add_argument(
        "--calibration-samples", type=int, default=None, help="single-trajectory timings per rep (12; long quick 4)"
    )
    parser.add_argument(
        "--calibration-batches", type=int, default=4, help="measured batches timed the sync way"
    )
    parser.add_argument("--calibration-reps", type=int, default=None, help="(default 3, quick 2; long quick 1)")
    parser.add_argument("--max-batch-trajectories", type=int, default=32, help="ThunderSyncStrategy option")
    parser.add_argument(
        "--score-max-padding", type=float, default=0.25, help="GRPOPolicy option (inf: the budget alone cuts)"
    )
    parser.add_argument(
        "--max-open-groups", type=int, default=None, help="ThunderSyncStrategy option (GPU memory)"
    )
    parser.add_argument(
        "--offload", default="none", choices=["none", "cpu", "pinned"], help="ThunderSyncStrategy option"
    )
    parser.add_argument(
        "--peak-flops", type=float, default=None, help="peak FLOP/s for MFU (default: measured)"
    )
    args = parser.parse_args(argv)
    q = args.quick
    w = WORKLOADS[args.workload]
    args.name = args.name or (NAME if args.workload == "short" else f"{NAME}_{args.workload}")
    args.rounds = args.rounds or (w.quick_rounds if q else 4)
    args.steps = args.steps or (w.quick_steps if q else 5)
    args.groups = args.groups or ((w.quick_groups or 16) if q else 16)
    args.group_size = args.group_size or ((w.quick_group_size or 8) if q else 8)
    args.hidden = args.hidden or ((w.quick_hidden or w.hidden) if q else w.hidden)
    args.intermediate = args.intermediate or (w.intermediate * args.hidden // w.hidden)
    args.vocab = args.vocab or ((w.quick_vocab or w.vocab) if q else w.vocab)
    args.layers = args.layers or w.layers
    args.prompt_tokens = args.prompt_tokens or w.prompt_tokens
    args.token_scale = args.token_scale or w.token_scale
    args.max_positions = w.max_positions
    args.calibrate = args.calibrate or w.calibrate
    if args.rollout_slots is None:
        args.rollout_slots = args.groups * args.group_size
    args.calibration_reps = args.calibration_reps or (w.quick_calibration_reps if q else 3)
    args.calibration_samples = args.calibration_samples or (w.quick_calibration_samples if q else 12)
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    torch.set_num_threads(args.threads)
    load_start = load_average()

    peak = args.peak_flops or peak_flops(device)
    print(f"peak (best 1024^3 float32 matmul, {args.threads} threads): {peak / 1e9:.1f} GFLOP/s", flush=True)
    workloads = [(args.seed + r, k) for r in range(args.rounds) for k in range(args.warmup, args.steps)]
    cal = calibrate(
        args,
        device,
        workloads[:: max(1, len(workloads) // args.calibration_batches)][: args.calibration_batches],
    )
    balance_makespans = [
        max(r for _, r in trace_schedule(args.trace, args.seed, k, args.groups, args.group_size)) for k in range(400)
    ]
    time_scale_s = args.time_scale or {
        "sync": lambda: cal["sync_per_trajectory_s"],
        "single": lambda: cal["single_s"],
        "balance": lambda: balance_time_scale(balance_makespans, cal["sync_work_per_step_s"]),
    }[args.calibrate]()
    print(
        f"calibration: single {cal['single_s'] * 1e3:.1f} ms, sync {cal['sync_per_trajectory_s'] * 1e3:.1f} ms per "
        f"trajectory (padding x{cal['padding_factor_sync']:.2f}); time_scale_s = {time_scale_s * 1e3:.1f} ms",
        flush=True,
    )
    policy = make_policy(args)
    n_params = sum(p.numel() for p in policy.parameters())
    n_matmul = matmul_params(policy)
    del policy

    blocks: dict[str, list[dict]] = {m: [] for m in MODES}
    order_log = []
    for rnd in range(args.rounds):
        order = MODES[rnd % len(MODES) :] + MODES[: rnd % len(MODES)]
        for mode in order:
            block = run_block(args, mode, time_scale_s, device, seed=args.seed + rnd)
            blocks[mode].append(block)
            order_log.append(mode)
            periods = [b.step_end - a.step_end for a, b in zip(block["steps"], block["steps"][1:])]
            print(
                f"round {rnd + 1}/{args.rounds} {mode}: step periods "
                + ", ".join(f"{p:.2f}" for p in periods)
                + f" s (load {load_average()})",
                flush=True,
            )

    rows = {
        m: [r for b in blocks[m] for r in step_rows(b, args, n_matmul, peak, time_scale_s)] for m in MODES
    }
    modes = {m: summarise(rows[m], blocks[m], args) for m in MODES}

    # ---- the bound, per measured trace step (the same steps in every mode)
    sync_work = modes["sync"]["busy_s"]
    least_work = min(
        sync_work, modes["streaming"]["busy_s"]
    )  # the batch's learner work, cheapest way measured
    end_of_step = sum(modes["streaming"]["busy_by_kind_median_s"].get(k, 0.0) for k in END_OF_STEP)
    measured = [(r["seed"], r["step"]) for r in rows["streaming"]]
    for m in MODES:
        assert sorted((r["seed"], r["step"]) for r in rows[m]) == sorted(measured), (
            "modes ran different workloads"
        )
    makespans = {
        key: max(r for _, r in trace_schedule(args.trace, key[0], key[1], args.groups, args.group_size))
        for key in measured
    }
    arrivals = {(r["seed"], r["step"]): r["arrivals"] for r in rows["streaming"]}
    work = {  # this step's learner work, the cheaper of the two ways measured on it
        key: min(
            statistics.mean(r["busy_s"] for r in rows[m] if (r["seed"], r["step"]) == key)
            for m in ("sync", "streaming")
        )
        for key in makespans
    }
    loose = {
        key: max(m * time_scale_s + cal["single_s"] + end_of_step, least_work) for key, m in makespans.items()
    }
    bounds = {
        key: max(
            makespans[key] * time_scale_s + cal["single_s"] + end_of_step,
            release_bound(arrivals[key], time_scale_s, work[key]) + end_of_step,
        )
        for key in makespans
    }
    bound_s = statistics.median(bounds[key] for key in measured)
    sync_s = modes["sync"]["median_step_s"]
    speed_stream = sync_s / modes["streaming"]["median_step_s"]
    speed_async = sync_s / modes["async"]["median_step_s"]
    bound_speedup = sync_s / bound_s
    efficiency = speed_stream / bound_speedup
    loose_s = statistics.median(loose[key] for key in measured)  # the bound before release dates
    without_release_dates = {
        "bound_step_s": loose_s,
        "bound_speedup": sync_s / loose_s,
        "efficiency": loose_s / modes["streaming"]["median_step_s"],
    }
    # the same with means (throughput ratios over the identical workloads)
    bound_mean = statistics.mean(bounds[key] for key in measured)
    t_sync = modes["sync"]["mean_step_s"]
    throughput = {
        "speedup_streaming_vs_sync": t_sync / modes["streaming"]["mean_step_s"],
        "speedup_async_vs_sync": t_sync / modes["async"]["mean_step_s"],
        "bound_speedup": t_sync / bound_mean,
        "efficiency": bound_mean / modes["streaming"]["mean_step_s"],
        "bound_step_s": bound_mean,
    }
    # what the trace itself allows: a learner that spends one unit per trajectory (B*G units per step)
    # and a perfect streaming learner (step = max(makespan, B*G units)), over 400 trace steps
    ceiling_ms = [
        max(r for _, r in trace_schedule(args.trace, args.seed, k, args.groups, args.group_size))
        for k in range(400)
    ]
    work_units = args.groups * args.group_size
    trace_ceiling = {
        "steps": 400,
        "sync_idle_fraction_mean": statistics.mean(m / (m + work_units) for m in ceiling_ms),
        "median_ratio": statistics.median(m + work_units for m in ceiling_ms)
        / statistics.median(max(m, work_units) for m in ceiling_ms),
        "throughput_ratio": sum(m + work_units for m in ceiling_ms)
        / sum(max(m, work_units) for m in ceiling_ms),
        "mean_of_per_step_ratios": statistics.mean((m + work_units) / max(m, work_units) for m in ceiling_ms),
        "note": "sync step = makespan + B*G units, perfect streaming step = max(makespan, B*G units), in trace units",
    }
    per_step = {
        f"seed{key[0]}-step{key[1]}": {
            "makespan_units": makespans[key],
            "bound_s": bounds[key],
            "bound_without_release_dates_s": loose[key],
            "learner_work_s": work[key],
            **{
                f"{m}_busy_s": statistics.mean(r["busy_s"] for r in rows[m] if (r["seed"], r["step"]) == key)
                for m in MODES
            },
            **{
                f"{m}_s": statistics.mean(r["period_s"] for r in rows[m] if (r["seed"], r["step"]) == key)
                for m in MODES
            },
        }
        for key in sorted(set(measured))
    }

    # ---- why: the learner's work per mode, in trace units
    stream_backward = modes["streaming"]["busy_by_kind_median_s"].get("backward", 0.0)
    sync_compute = sum(modes["sync"]["busy_by_kind_median_s"].get(k, 0.0) for k in ("backward", "barrier"))
    trajectories = args.groups * args.group_size
    diagnosis = {
        "sync_learner_work_s": sync_work,
        "sync_forward_backward_s": sync_compute,
        "streaming_learner_work_s": modes["streaming"]["busy_s"],
        "streaming_backward_s": stream_backward,
        "streaming_over_sync_learner_work": modes["streaming"]["busy_s"] / sync_work,
        "streaming_over_sync_cpu_per_step": modes["streaming"]["cpu_seconds_per_step"]
        / modes["sync"]["cpu_seconds_per_step"],
        "async_over_sync_cpu_per_step": modes["async"]["cpu_seconds_per_step"] / modes["sync"]["cpu_seconds_per_step"],
        "streaming_backward_per_trajectory_s": stream_backward / trajectories,
        "sync_forward_backward_per_trajectory_s": sync_compute / trajectories,
        "makespan_s_mean": statistics.mean(makespans[k] for k in measured) * time_scale_s,
        "makespan_s_median": statistics.median(makespans[k] for k in measured) * time_scale_s,
        "learner_work_in_bound_s": least_work,
        "end_of_step_s": end_of_step,
        "sync_step_model_s": statistics.median(makespans[k] for k in measured) * time_scale_s + sync_work,
        "streaming_excess_over_bound_s": modes["streaming"]["median_step_s"] - bound_s,
        "single_over_sync_backward_per_trajectory": cal["single_s"] / cal["sync_per_trajectory_s"],
        "rollout_head_start_median_s": {m: modes[m]["rollout_head_start_median_s"] for m in MODES},
        "async_over_streaming_throughput": modes["streaming"]["mean_step_s"] / modes["async"]["mean_step_s"],
        "async_over_streaming_median": modes["streaming"]["median_step_s"] / modes["async"]["median_step_s"],
        "note": (
            "bound = max(makespan + one single-trajectory backward + barrier/optimizer/publish, release-date "
            "bound of the cheapest learner work + barrier/optimizer/publish). streaming_over_sync_learner_work compares the streaming learner's per-step work (mostly "
            "one-trajectory or small-bucket backward passes) with the synchronous one (one batch padded to the "
            "longest trajectory): above 1, streaming is learner-bound sooner. rollout_head_start: how long "
            "before a step began its rollouts were already generating: ~0 in sync and streaming (issued "
            "when the previous step's weights were published), about one step in async (issued when the "
            "previous step started, with stale weights). The trace-replay engine serialises only "
            "generation (content_ready), verdicts overlap freely, so async overlaps consecutive batches' "
            "verdict tails, which a zero-staleness learner cannot do. *_cpu_per_step: the fit's process CPU "
            "seconds per step (every thread, warm-up steps included): the learner-work ratio that other jobs on "
            "a shared machine distort least."
        ),
    }

    results = {
        "description": "sync vs streaming vs one-step async GRPO on the paper_tail trace, interleaved, real learner",
        "workload_name": args.workload,
        "targets": TARGETS[args.workload],
        "speedup_streaming_vs_sync": speed_stream,
        "speedup_async_vs_sync": speed_async,
        "bound_speedup": bound_speedup,
        "efficiency": efficiency,
        "streaming_throughput_over_async": speed_stream / speed_async,
        "targets_met": targets_met(
            TARGETS[args.workload], efficiency, speed_stream / speed_async, diagnosis, modes
        ),
        "speedup_definition": "median sync step / median mode step over the same (seed, step) workloads; "
        "'throughput' has the same ratios with mean step times",
        "throughput": throughput,
        "trace_ceiling": trace_ceiling,
        "bound_step_s": bound_s,
        "without_release_dates": without_release_dates,
        "per_step": per_step,
        "modes": modes,
        "diagnosis": diagnosis,
        "calibration": {
            **cal,
            "calibrate": "explicit" if args.time_scale else args.calibrate,
            "time_scale_s": time_scale_s,
            "trace_sync_idle_fraction_model": sync_idle_fraction(
                TraceReplayEngineConfig(trace=args.trace), args.groups, args.group_size
            ),
        },
        "mfu_definition": "6 * N * learner_tokens / (step seconds * peak); N = parameters in matmuls (all but the "
        "input embedding); peak = best 1024^3 float32 matmul rate measured here with the same threads",
        "peak_flops": peak,
        "peak_flops_source": "explicit (--peak-flops)"
        if args.peak_flops
        else f"calibrated: best of 5 float32 1024x1024 matmuls on {device.type}, {args.threads} threads",
        "model": {
            "type": "qwen3",
            "config": model_config(args),
            "num_params": n_params,
            "matmul_params": n_matmul,
        },
        "workload": {
            "trace": args.trace,
            "prompt_tokens": args.prompt_tokens,
            "token_scale": args.token_scale,
            "trajectory_tokens_min_mean_max": [cal["tokens_min"], cal["tokens_mean"], cal["tokens_max"]],
            "setup_fraction": args.setup_fraction,
            "prepare_ahead": args.prepare_ahead,
            "sync_idle_fraction_target": 0.495,
            "groups": args.groups,
            "group_size": args.group_size,
            "seeds": [args.seed + r for r in range(args.rounds)],
            "rounds": args.rounds,
            "steps_per_block": args.steps,
            "warmup_steps": args.warmup,
            "order": order_log,
            "max_batch_trajectories": args.max_batch_trajectories,
            "score_max_padding": args.score_max_padding,
            "max_open_groups": args.max_open_groups,
            "offload": args.offload,
            "device": args.device,
        },
        "threads": args.threads,
        "quick": q,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    path = write_result(args.out, args.name, results)
    timeline_png(
        str(path.with_suffix(".png")), {m: blocks[m][-1] for m in MODES}, args, time_scale_s, results
    )
    for m in MODES:
        r = modes[m]
        print(
            f"{m:9s}: step {r['median_step_s']:.3f} s, idle {r['learner_idle_fraction']:.1%}, MFU {r['mfu']:.2%}, "
            f"staleness max {r['staleness_max']}, learner busy {r['busy_s']:.3f} s, "
            f"{r['trajectories_per_backward_call']:.1f} trajectories per backward call"
        )
    print(
        f"speedup streaming/sync {speed_stream:.3f}x, async/sync {speed_async:.3f}x, bound {bound_speedup:.3f}x, "
        f"efficiency {efficiency:.3f} (without release dates {without_release_dates['efficiency']:.3f}), "
        f"streaming/async throughput {speed_stream / speed_async:.3f}, streaming/sync "
        f"learner work {diagnosis['streaming_over_sync_learner_work']:.3f}; targets met {results['targets_met']}"
    )
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
