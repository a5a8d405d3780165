"""The paper's idle measurement on real SWE-bench episodes: measured on CPU containers, projected at the
paper's balance through overlap.py.

Input: a ``make demo-swe`` run (``configs/swebench_cpu.yaml``): its ``swe_trace.json`` (one row per
real episode: ``content_ready`` = seconds from the episode's start to its verdict's start,
``reward_ready`` = to its end; written by ``benchmarks/swe_episodes.py``) and ``summary.json``.

Measured (this machine, podman containers, a tiny random policy):
    the episodes' time distribution and phases, the resolved rate, the streaming learner's idle
    fraction in that run, and ``sync_idle_at_measured_cost``: the idle fraction of a synchronous
    learner that waits for every verdict, then spends the run's learner seconds per trajectory
    (about (1 - idle) x median step x steps / trajectories, from summary.json) on each
    (``rollout.replay.sync_idle_fraction`` over the real episode times, at the run's B x G).
    An episode's clock starts when its container is prepared, and the strategy prepares step k+1's
    episodes while step k runs: episode times include that wait for the step's weights.

Projected (the paper's balance): the trace is replayed by ``overlap.py`` (``--calibrate balance``:
the time scale at which the synchronous learner idles the paper's 49.5% on this trace at the replay's
batch); what is then measured is how the real episode-time SHAPE (its spread and tail) turns into
sync idle, streaming vs sync step time and throughput, and the bound, with a real Qwen3 learner on
CPU. The absolute seconds are those of the replay, not of the containers.

``--graded VALIDATION_JSON``: a tiny random policy submits empty patches, whose verdict is the patch
capture alone (no test run). This variant replaces each episode's verdict with the measured gold-patch
verdict of its instance in the validation report (a fresh /testbed, the patch applied, the eval script's
test run in a container, swebench's report: ``gold_eval_s``): the run's episodes as they would be if every
one submitted a patch that runs the tests. Its files carry the suffix ``_graded``.

Writes ``OUT/swe_cpu_trace[_graded].json`` (the trace replayed), ``OUT/overlap_swe_cpu[_graded].json`` and
its timeline (overlap.py's own), and ``OUT/swe_cpu_overlap[_graded].json`` + ``.png`` (measured beside
projected beside the paper's 49.5% sync idle and 1.91x).

Usage: python benchmarks/swe_overlap.py [--run runs/demo-swe] [--out benchmarks/results]
[--quick] [overlap.py options]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import write_result  # noqa: E402
from thundersync_lightning.rollout import TraceReplayEngineConfig  # noqa: E402
from thundersync_lightning.rollout.replay import sync_idle_fraction  # noqa: E402

PAPER = {
    "sync_idle_fraction": 0.495,
    "streaming_speedup": 1.91,
    "note": (
        "the paper's measured synchronous idle and the long workload's streaming / sync (overlap_long.json)"
    ),
}
NAME = "swe_cpu_overlap"


def measured(run: dict[str, Any], trace_path: str, groups: int, group_size: int) -> dict[str, Any]:
    swe = run.get("swebench") or {}
    idle = run.get("learner_idle_fraction")
    trajectories = run.get("trajectories") or 0
    steps = run.get("steps") or 0
    # the run's learner seconds per trajectory: busy = (1 - idle) x the steps' time
    busy = (1.0 - idle) * run["step_seconds_median"] * steps if idle is not None and steps else None
    cost = busy / trajectories if busy and trajectories else None
    sync_idle = None
    if cost:
        sync_idle = sync_idle_fraction(
            TraceReplayEngineConfig(trace=trace_path), groups, group_size, cost, steps=200
        )
    return {
        "episodes": swe.get("episodes"),
        "resolved_rate": swe.get("resolved_rate"),
        "episode_seconds": swe.get("episode_seconds"),
        "phase_seconds_median": swe.get("phase_seconds_median"),
        "commands_per_episode_mean": swe.get("commands_per_episode_mean"),
        "verdicts": swe.get("verdicts"),
        "streaming_learner_idle_fraction": idle,
        "learner_seconds_per_trajectory": cost,
        "sync_idle_at_measured_cost": sync_idle,
        "batch": [groups, group_size],
        "steps": steps,
    }


def projected(
    out: str, trace: str, quick: bool, threads: int, extra: list[str], suffix: str
) -> dict[str, Any]:
    name = f"overlap_swe_cpu{suffix}"
    cmd = [
        sys.executable,
        os.path.join(os.path.dirname(os.path.abspath(__file__)), "overlap.py"),
        "--trace",
        trace,
        "--calibrate",
        "balance",
        "--name",
        name,
        "--out",
        out,
        "--threads",
        str(threads),
    ]
    if quick:
        cmd.append("--quick")
    cmd += extra
    subprocess.run(cmd, check=True)
    with open(os.path.join(out, f"{name}.json")) as f:
        ov = json.load(f)
    modes = ov["modes"]
    return {
        "command": " ".join(cmd[1:]),
        "sync_idle_fraction": modes["sync"]["learner_idle_fraction"],
        "streaming_idle_fraction": modes["streaming"]["learner_idle_fraction"],
        "speedup_streaming_vs_sync_median": ov["speedup_streaming_vs_sync"],
        "speedup_streaming_vs_sync_throughput": ov["throughput"]["speedup_streaming_vs_sync"],
        "bound_speedup": ov["bound_speedup"],
        "efficiency": ov["efficiency"],
        "speedup_async_vs_sync": ov["speedup_async_vs_sync"],
        "time_scale_s_per_trace_second": ov["calibration"].get("time_scale_s"),
        "batch": [ov["workload"]["groups"], ov["workload"]["group_size"]],
        "file": f"{name}.json",
    }


def figure(
    path: str, trace_rows: list[dict[str, Any]], m: dict[str, Any], p: dict[str, Any], graded: bool
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    rows = sorted(trace_rows, key=lambda r: r["reward_ready"])
    xs = range(len(rows))
    a.bar(
        xs,
        [r["content_ready"] for r in rows],
        label="start -> verdict (container start, turns)",
        color="#7aa6c2",
    )
    a.bar(
        xs,
        [r["reward_ready"] - r["content_ready"] for r in rows],
        bottom=[r["content_ready"] for r in rows],
        label="verdict (patch capture, eval run in a container)",
        color="#d98c5f",
    )
    a.set_xlabel("episode (sorted by length)")
    a.set_ylabel("seconds")
    a.set_title(
        f"{len(rows)} real SWE-bench episodes (CPU, podman)"
        + ("\nverdicts: the instance's gold-patch eval run" if graded else ""),
        fontsize=10,
    )
    a.legend(fontsize=8)
    labels = ["sync idle", "streaming / sync", "bound"]
    paper = [PAPER["sync_idle_fraction"], PAPER["streaming_speedup"], None]
    proj = [p["sync_idle_fraction"], p["speedup_streaming_vs_sync_median"], p["bound_speedup"]]
    meas = [m["sync_idle_at_measured_cost"], None, None]
    width = 0.27
    for i, (name, vals, color) in enumerate(
        (
            ("measured cost (tiny policy)", meas, "#999999"),
            ("projected at the paper's balance", proj, "#4c72b0"),
            ("paper", paper, "#c44e52"),
        )
    ):
        pos = [j + (i - 1) * width for j in range(len(labels)) if vals[j] is not None]
        b.bar(pos, [v for v in vals if v is not None], width, label=name, color=color)
    b.set_xticks(range(len(labels)), labels)
    b.set_title("idle fraction and speed-up")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default="runs/demo-swe")
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--quick", action="store_true", help="overlap.py --quick (minutes)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--run-groups", type=int, default=4, help="the run's data.groups_per_step")
    ap.add_argument("--run-group-size", type=int, default=2, help="the run's data.group_size")
    ap.add_argument(
        "--graded", default=None, help="a validation report: verdicts of patches that run the tests"
    )
    args, extra = ap.parse_known_args(argv)  # the rest goes to overlap.py (--rounds, --steps, ...)
    with open(os.path.join(args.run, "summary.json")) as f:
        run = json.load(f)
    with open(os.path.join(args.run, "swe_trace.json")) as f:
        trace = json.load(f)
    os.makedirs(args.out, exist_ok=True)
    suffix, rows, source = (
        "",
        trace["rows"],
        "make demo-swe (configs/swebench_cpu.yaml), benchmarks/swe_episodes.py",
    )
    if args.graded:
        with open(args.graded) as f:
            gold = {
                r["instance_id"]: r["gold_eval_s"] for r in json.load(f)["instances"] if "gold_eval_s" in r
            }
        rows = [{**r, "reward_ready": r["content_ready"] + gold[r["instance_id"]]} for r in rows]
        suffix, source = "_graded", source + f"; verdicts: gold_eval_s of {os.path.basename(args.graded)}"
    trace_path = os.path.join(args.out, f"swe_cpu_trace{suffix}.json")
    with open(trace_path, "w") as f:
        json.dump({"unit": "seconds", "source": source, "rows": rows}, f, indent=1)
        f.write("\n")
    m = measured(run, trace_path, args.run_groups, args.run_group_size)
    p = projected(args.out, trace_path, args.quick, args.threads, extra, suffix)
    result = {
        "description": (
            "The paper's idle measurement on real SWE-bench episodes: measured on CPU podman "
            "containers with a tiny random policy; projected by replaying the episode-time trace through "
            "overlap.py at the paper's balance (sync idle 49.5%)"
        ),
        "measured": m,
        "projected": p,
        "paper": PAPER,
        "trace": os.path.basename(trace_path),
        "graded": args.graded is not None,
        "quick": args.quick,
    }
    write_result(args.out, NAME + suffix, result)
    figure(os.path.join(args.out, f"{NAME}{suffix}.png"), rows, m, p, args.graded is not None)
    print(
        json.dumps(
            {
                "measured_sync_idle_at_measured_cost": m["sync_idle_at_measured_cost"],
                "projected": {
                    k: p[k]
                    for k in (
                        "sync_idle_fraction",
                        "speedup_streaming_vs_sync_median",
                        "speedup_streaming_vs_sync_throughput",
                        "bound_speedup",
                    )
                },
                "paper": PAPER,
            },
            indent=1,
        )
    )
    return result


if __name__ == "__main__":
    main()
