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

    bound_k = max(M_k * time_scale_s,  max_j (c_j * time_scale_s + W_k * T_{>=j} / T)) + end_of_step

M_k: the step's rollout makespan in trace units (the last reward; a reward that lands after its
content needs only a fold, its backward can be done before), end_of_step: the barrier, the
optimizer step and the weight publish (streaming's measured medians), W_k: step k's learner work
done the cheapest way measured (the smaller of the synchronous and the streaming learner's busy
seconds on that very step: steps differ in tokens), c_j: trajectory j's content_ready (units),
T_{>=j} / T: the share of the step's tokens in trajectories whose content lands at c_j or later.
The second term is the single-machine bound with release dates: no learner, however it batches,
works on a trajectory before its content lands, and the barrier follows the last of that work.
``without_release_dates`` reports a looser bound (``max(M_k s + c_single +
end_of_step, W)`` with W the median work over all steps and c_single one trajectory's streaming
backward, which overstated rollout-bound steps: their last reward needs no backward).
``bound_speedup`` = sync step / bound, ``efficiency`` = streaming's speedup / bound_speedup.

Workloads (``--workload``, :mod:`_workloads`): ``short`` (default; the numbers above) and ``long``
(a 20M-parameter model, ~500-2000-token trajectories, compute-bound backward passes; calibrated
with ``balance``: the time scale at which the synchronous learner idles 49.5% at this batch).
``long`` writes ``overlap_long.json``; ``paper`` (a Qwen3-1.7B shape in bf16, coding-agent
lengths: :mod:`_workloads`) writes ``overlap_paper.json`` with peak VRAM per mode next to the
plan's (:mod:`_overlap_paper`).

Environment set-up (``--setup-fraction f``): every trajectory first spends f x its generation time
creating its environment; ``--prepare-ahead`` (default) lets the strategy hand step k+1 to the
engine when step k starts (``ThunderSyncStrategy(prepare_ahead=True)``), ``--no-prepare-ahead``
does not. The bound ignores set-up (what a perfect prefetch allows).

Usage: python benchmarks/overlap.py [--quick] [--workload short|long] [--out DIR]
[--threads N] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _common import write_result  # noqa: E402
from _harness import (  # noqa: E402
    MODES,
    fit,
    load_average,
    matmul_params,
    peak_flops,
    schedule_index,
    trace_schedule,
)
from _overlap_bound import release_bound, step_bounds, trace_ceiling  # noqa: E402
from _overlap_figure import timeline_png  # noqa: E402
from _overlap_paper import vram_report  # noqa: E402
from _overlap_setup import (  # noqa: E402
    calibrate,
    learner_dtype,
    make_data,
    make_policy,
    model_config,
    parse_args,
    workload_record,
)
from _workloads import balance_time_scale  # noqa: E402
from thundersync_lightning.rollout import TraceReplayEngineConfig  # noqa: E402
from thundersync_lightning.rollout.replay import sync_idle_fraction  # noqa: E402

__all__ = ["main", "release_bound"]

NAME = "overlap"
TARGETS = {  # issue 16, per workload (paper: issue 45, as long)
    "short": {"efficiency": 0.97, "streaming_over_sync_learner_work_max": 1.02},
    "long": {
        "efficiency": 0.97,
        "streaming_throughput_over_async": 0.95,
        "streaming_over_sync_learner_work_max": 1.02,
    },
}
TARGETS["paper"] = TARGETS["long"]
END_OF_STEP = ("barrier", "optimizer", "publish")


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
        max_batch_tokens=args.max_batch_tokens,
        min_batch_trajectories=args.min_batch_trajectories,
        max_open_groups=args.max_open_groups,
        offload=args.offload,
        prepare_ahead=args.prepare_ahead,
        split_backward=args.split_backward,
        max_held_trajectories=args.max_held_trajectories,
        trainer_kwargs={"precision": args.precision},
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
            r.content_ready_at - sched[schedule_index(r.trajectory_id, args.group_size)][0] * time_scale_s
            for r in s.trajectories
        )
        period = s.step_end - prev.step_end
        kinds: dict[str, float] = {}
        by_path: dict[str, dict[str, float]] = {}  # which rule of next_batch chose each backward call
        for iv in s.busy:
            kinds[iv.kind] = kinds.get(iv.kind, 0.0) + iv.seconds
            if iv.kind == "backward":
                p = by_path.setdefault(iv.path, {"calls": 0, "trajectories": 0, "seconds": 0.0})
                p["calls"] += 1
                p["trajectories"] += iv.trajectories
                p["seconds"] += iv.seconds
        busy = sum(kinds.values())
        backward_calls = sum(p["calls"] for p in by_path.values())
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
                "waited_for_rows": s.min_batch_trajectories,
                "backward_by_path": by_path,
                "accumulator_peak_bytes": s.accumulator.total,
                "rollout_head_start_s": prev.step_end - gen_start,
                # (content_ready in trace units, tokens) per trajectory: the release-date bound
                "arrivals": sorted(
                    (sched[schedule_index(r.trajectory_id, args.group_size)][0], r.num_tokens)
                    for r in s.trajectories
                ),
            }
        )
    return rows


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
        "waited_for_rows_median": med(rows, "waited_for_rows"),
        "trajectories_per_backward_call": trajectories / max(1.0, med(rows, "backward_calls")),
        "backward_by_path_median": {  # per step: calls, trajectories and seconds by next_batch's rule
            path: {
                field: statistics.median(r["backward_by_path"].get(path, {}).get(field, 0) for r in rows)
                for field in ("calls", "trajectories", "seconds")
            }
            for path in sorted({p for r in rows for p in r["backward_by_path"]})
        },
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
    met = {
        "efficiency": efficiency >= targets["efficiency"],
        "streaming_staleness_0": modes["streaming"]["staleness_max"] == 0,
    }
    if "streaming_throughput_over_async" in targets:
        met["streaming_throughput_over_async"] = over_async >= targets["streaming_throughput_over_async"]
    met["streaming_over_sync_learner_work"] = (
        diagnosis["streaming_over_sync_learner_work"] <= targets["streaming_over_sync_learner_work_max"]
    )
    return met


# ---------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv, __doc__.split("\n\n")[0], NAME)
    q = args.quick
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    load_start = load_average()

    dtype = learner_dtype(args)  # CPUs without bf16 matmul units take seconds for 1024^3 in bf16
    size = 4096 if device.type == "cuda" else 1024 if dtype == torch.float32 else 256
    peak = args.peak_flops or peak_flops(device, size, dtype=dtype)
    print(
        f"peak (best {size}^3 {dtype} matmul, {args.threads} threads): {peak / 1e9:.1f} GFLOP/s", flush=True
    )
    workloads = [(args.seed + r, k) for r in range(args.rounds) for k in range(args.warmup, args.steps)]
    cal = calibrate(
        args,
        device,
        workloads[:: max(1, len(workloads) // args.calibration_batches)][: args.calibration_batches],
    )
    balance_makespans = [
        max(r for _, r in trace_schedule(args.trace, args.seed, k, args.groups, args.group_size))
        for k in range(400)
    ]
    time_scale_s = (
        args.time_scale
        or {
            "sync": lambda: cal["sync_per_trajectory_s"],
            "single": lambda: cal["single_s"],
            "balance": lambda: balance_time_scale(balance_makespans, cal["sync_work_per_step_s"]),
        }[args.calibrate]()
    )
    print(
        f"calibration: single {cal['single_s'] * 1e3:.1f} ms, sync {cal['sync_per_trajectory_s'] * 1e3:.1f} "
        f"ms per trajectory (padding x{cal['padding_factor_sync']:.2f}); "
        f"time_scale_s = {time_scale_s * 1e3:.1f} ms",
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
    measured, makespans, bounds, loose, per_step = step_bounds(
        args, rows, cal["single_s"], time_scale_s, end_of_step, least_work
    )
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
        "async_over_sync_cpu_per_step": modes["async"]["cpu_seconds_per_step"]
        / modes["sync"]["cpu_seconds_per_step"],
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
            "bound = max(makespan, release-date bound of the step's cheapest learner work) + "
            "barrier/optimizer/publish. streaming_over_sync_learner_work compares the streaming learner's "
            "per-step work (mostly one-trajectory or small-bucket backward passes) with the synchronous one "
            "(one batch padded to the longest trajectory): above 1, streaming is learner-bound sooner. "
            "rollout_head_start: how long before a step began its rollouts were already generating: ~0 in "
            "sync and streaming (issued when the previous step's weights were published), about one step in "
            "async (issued when the previous step started, with stale weights). The trace-replay engine "
            "serialises only generation (content_ready), verdicts overlap freely, so async overlaps "
            "consecutive batches' verdict tails, which a zero-staleness learner cannot do. *_cpu_per_step: "
            "the fit's process CPU seconds per step (every thread, warm-up steps included): the learner-work "
            "ratio that other jobs on a shared machine distort least."
        ),
    }

    results = {
        "description": (
            "sync vs streaming vs one-step async GRPO on the paper_tail trace, interleaved, real learner"
        ),
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
        "trace_ceiling": trace_ceiling(args.trace, args.seed, args.groups, args.group_size),
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
        "mfu_definition": (
            "6 * N * learner_tokens / (step seconds * peak); N = parameters in matmuls (all "
            "but the input embedding); peak = best 1024^3 float32 matmul rate "
            "measured here with the same threads"
        ),
        "peak_flops": peak,
        "peak_flops_source": "explicit (--peak-flops)"
        if args.peak_flops
        else f"calibrated: best of 5 {dtype} {size}x{size} matmuls on {device.type}, {args.threads} threads",
        "vram": vram_report(args, modes, model_config(args), n_params),
        "model": {
            "type": "qwen3",
            "config": model_config(args),
            "num_params": n_params,
            "matmul_params": n_matmul,
        },
        "workload": workload_record(args, cal, order_log),
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
            f"{m:9s}: step {r['median_step_s']:.3f} s, idle {r['learner_idle_fraction']:.1%}, MFU "
            f"{r['mfu']:.2%}, staleness max {r['staleness_max']}, learner busy {r['busy_s']:.3f} s, "
            f"{r['trajectories_per_backward_call']:.1f} trajectories per backward call ("
            + ", ".join(
                f"{path} {c['calls']:g} x "
                f"{c['trajectories'] / max(1, c['calls']):.1f} in {c['seconds']:.3f} s"
                for path, c in r["backward_by_path_median"].items()
            )
            + ", medians per step)"
        )
    print(
        f"speedup streaming/sync {speed_stream:.3f}x, async/sync {speed_async:.3f}x, bound "
        f"{bound_speedup:.3f}x, efficiency {efficiency:.3f} (without release dates "
        f"{without_release_dates['efficiency']:.3f}), streaming/async throughput "
        f"{speed_stream / speed_async:.3f}, streaming/sync learner work "
        f"{diagnosis['streaming_over_sync_learner_work']:.3f}; targets met {results['targets_met']}"
    )
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
