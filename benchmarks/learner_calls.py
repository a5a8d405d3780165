"""What a learner call costs per trajectory, by its size and by whether the rollout is still running.

One real fit per mode (sync, streaming) of ``time_to_target.py``'s balanced workload (the embedded
engine generating on the same CPU as the learner), ``--steps`` steps, the first ``--warmup``
dropped. From each step's ``StepStats``: every backward interval (one call: its trajectories and
seconds) and the step's last verdict. Per mode and call size (1, 2-3, 4-7, 8-15, 16-31, 32+
trajectories), split by whether the call ended before or after the step's last verdict: calls,
trajectories and wall milliseconds per trajectory. Per mode: medians per step of the step time,
the last verdict, the learner's backward seconds and its calls.

A streaming learner that computes while the engine generates shares the cores with it; calls
that end after the last verdict run alone, as all of sync's do. ``ms_per_trajectory`` before
against after, at the same size, is what that sharing costs here.

``--min-batch-trajectories K ...`` adds a streaming fit per K other than 1 (mode
``streaming_min{K}``: ``ThunderSyncStrategy(min_batch_trajectories=K)``, K an integer or ``auto``;
the learner waits for K rows while content is still to land): fewer, larger calls.
``step_over_sync`` compares every mode's median step with sync's, ``cpu_over_sync`` the learner
thread's CPU seconds per step (the learner's work, whatever else runs on the machine).
``--lr 0`` keeps the policy fixed: every fit then replays the same trajectories, step for step.

    python benchmarks/learner_calls.py [--quick] [--out DIR] [--steps 40] [--hidden 128]
    [--min-batch-trajectories 1 16]
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

import time_to_target  # noqa: E402
from _common import add_common_args, write_bar_chart, write_result  # noqa: E402
from _harness import fit, load_average  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.rollout import EmbeddedEngineConfig  # noqa: E402

NAME = "learner_calls"
SIZES = ((1, 1), (2, 3), (4, 7), (8, 15), (16, 31), (32, 10**9))


def size_label(n: int) -> str:
    lo, hi = next((lo, hi) for lo, hi in SIZES if lo <= n <= hi)
    return str(lo) if lo == hi else (f"{lo}+" if hi >= 10**9 else f"{lo}-{hi}")


def run_mode(args: argparse.Namespace, mode: str, least: int | str = 1) -> dict:
    workload = argparse.Namespace(
        balanced_hidden=args.hidden,
        balanced_latency_median_s=args.latency_median_s,
        balanced_context_tokens=0,
    )
    model, tasks = time_to_target.workload(workload, "balanced")
    torch.manual_seed(args.seed)
    policy = GRPOPolicy(config=model, lr=args.lr)
    data = RolloutDataModule(
        tasks=tasks,
        engine=EmbeddedEngineConfig(temperature=1.0, num_threads=1, env_workers=32, startup_timeout_s=900),
        group_size=8,
        groups_per_step=args.groups,
        seed=args.seed,
    )
    cpu: list[float] = []  # the learner thread's CPU seconds at each step's end (on_step runs on it)
    record = fit(
        mode, policy, data, args.steps, trainer_kwargs={"gradient_clip_val": 1.0},
        on_step=lambda *_: cpu.append(time.thread_time()), min_batch_trajectories=least,
    )  # fmt: skip
    cells: dict[tuple[str, str], list[tuple[int, float]]] = {}
    per_step: dict[str, list[float]] = {"step_s": [], "last_verdict_s": [], "backward_s": [], "calls": [],
                                        "learner_cpu_s": [], "waited_for_rows": []}  # fmt: skip
    for k, stats in enumerate(record.steps[args.warmup :], start=args.warmup):
        last = max(t.reward_ready_at for t in stats.trajectories if t.reward_ready_at is not None)
        calls = [i for i in stats.busy if i.kind == "backward"]
        for i in calls:
            when = "before_last_verdict" if i.end <= last else "after_last_verdict"
            cells.setdefault((size_label(i.trajectories), when), []).append((i.trajectories, i.seconds))
        per_step["step_s"].append(stats.step_end - stats.step_start)
        per_step["last_verdict_s"].append(last - stats.step_start)
        per_step["backward_s"].append(sum(i.seconds for i in calls))
        per_step["calls"].append(len(calls))
        per_step["learner_cpu_s"].append(cpu[k] - cpu[k - 1])
        per_step["waited_for_rows"].append(stats.min_batch_trajectories)
    table = {}
    for (label, when), rows in sorted(cells.items()):
        trajectories = sum(n for n, _ in rows)
        table.setdefault(label, {})[when] = {
            "calls": len(rows),
            "trajectories": trajectories,
            "ms_per_trajectory": 1000 * sum(s for _, s in rows) / trajectories,
        }
    return {"by_call_size": table, **{f"{k}_median": statistics.median(v) for k, v in per_step.items()}}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)
    parser.add_argument("--steps", type=int, default=None, help="steps per mode (default 40; quick 8)")
    parser.add_argument("--warmup", type=int, default=None, help="first steps dropped (default 5; quick 2)")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128, help="Qwen3 width (time_to_target's balanced)")
    parser.add_argument("--latency-median-s", type=float, default=0.002)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--lr", type=float, default=3e-3,
        help="0: the policy never changes, so every mode replays the same trajectories (a paired comparison)",
    )  # fmt: skip
    parser.add_argument(
        "--min-batch-trajectories", type=lambda v: v if v == "auto" else int(v), nargs="+", default=[1],
        help="streaming fits with ThunderSyncStrategy(min_batch_trajectories=K), one per K (default 1)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    args.steps = args.steps or (8 if args.quick else 40)
    args.warmup = args.warmup if args.warmup is not None else (2 if args.quick else 5)
    torch.set_num_threads(args.threads)
    load_start = load_average()
    modes = {mode: run_mode(args, mode) for mode in ("sync", "streaming")}
    for k in dict.fromkeys(args.min_batch_trajectories):
        if k != 1:
            modes[f"streaming_min{k}"] = run_mode(args, "streaming", k)
    for result in modes.values():
        result["step_over_sync"] = result["step_s_median"] / modes["sync"]["step_s_median"]
        result["backward_over_sync"] = result["backward_s_median"] / modes["sync"]["backward_s_median"]
        result["cpu_over_sync"] = result["learner_cpu_s_median"] / modes["sync"]["learner_cpu_s_median"]
    payload = {
        "description": "learner cost per trajectory by call size, before and after the step's last verdict",
        "modes": modes,
        "streaming_over_sync_backward_s": modes["streaming"]["backward_s_median"]
        / modes["sync"]["backward_s_median"],
        "settings": {
            k: getattr(args, k)
            for k in (
                "steps",
                "warmup",
                "groups",
                "hidden",
                "latency_median_s",
                "seed",
                "lr",
                "min_batch_trajectories",
            )
        },
        "threads": args.threads,
        "quick": args.quick,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    path = write_result(args.out, NAME, payload)
    bars: dict[str, dict[str, float]] = {}
    for mode, result in modes.items():
        for label, cell in result["by_call_size"].items():
            for when, v in cell.items():
                bars.setdefault(label, {})[f"{mode}, {when.replace('_', ' ')}"] = v["ms_per_trajectory"]
    keys = sorted({k for b in bars.values() for k in b})
    write_bar_chart(
        path.with_suffix(".png"),
        {label: {k: b.get(k, 0.0) for k in keys} for label, b in bars.items()},
        ylabel="wall ms per trajectory",
        title="learner calls by size (trajectories per call)",
    )
    for mode, result in modes.items():
        print(
            f"{mode}: step {result['step_s_median']:.3f} s, last verdict "
            f"{result['last_verdict_s_median']:.3f} s, backward {result['backward_s_median']:.3f} s in "
            f"{result['calls_median']:.0f} calls (medians per step); step {result['step_over_sync']:.2f}x "
            f"sync's, backward {result['backward_over_sync']:.2f}x, learner CPU "
            f"{result['cpu_over_sync']:.2f}x; waited for {result['waited_for_rows_median']:.0f} rows"
        )
        for label, cell in result["by_call_size"].items():
            text = ", ".join(
                f"{w}: {v['ms_per_trajectory']:.2f} ms x {v['trajectories']}" for w, v in cell.items()
            )
            print(f"  {label:>5} per call: {text}")
    print(f"streaming / sync backward seconds per step: {payload['streaming_over_sync_backward_s']:.2f}")
    print(f"wrote {path}")
    return payload


if __name__ == "__main__":
    main()
