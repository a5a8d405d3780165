"""Plot the held-out curve of a learning demo's run: ``configs/code_learn.yaml`` (``make demo-code``)
or ``configs/tool_learn.yaml`` (``make demo-tools``, ``--name tool_learn``).

    python benchmarks/code_learn_curve.py runs/demo-code [--out benchmarks/results] [--name code_learn]

Reads the CSV logger's ``metrics.csv`` (``val/pass_at_1``, ``val/pass_at_k``, ``rollout/reward_mean``
and ``rollout/truncated_action_fraction`` per step) and ``summary.json``; writes ``<name>.png`` and
``<name>.json`` (the curves, the summary, and ``ended_turn_fraction``: the share of training actions
that ended their turn with the end-of-turn token, averaged over the first and the last
``WINDOW`` steps; with the command, commit and machine) under ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _common import write_result  # noqa: E402

TITLES = {
    "code_learn": "configs/code_learn.yaml: held-out tasks, tiny Qwen3 from scratch, 2 CPU cores",
    "tool_learn": "configs/tool_learn.yaml: held-out requests, native tool calls, 2 CPU cores",
}


def read_curve(run: str) -> dict[str, list[tuple[int, float]]]:
    files = sorted(glob.glob(os.path.join(run, "csv", "version_*", "metrics.csv")))
    if not files:
        raise SystemExit(f"no csv/version_*/metrics.csv under {run}")
    curves: dict[str, list[tuple[int, float]]] = {
        "val/pass_at_1": [],
        "val/pass_at_k": [],
        "rollout/reward_mean": [],
        "rollout/truncated_action_fraction": [],
    }
    with open(files[-1]) as f:
        for row in csv.DictReader(f):
            for key, points in curves.items():
                if row.get(key):
                    points.append((int(row["step"]), float(row[key])))
    return curves


#: Steps averaged for the first and last turn-ending fractions (as the summary's reward window).
WINDOW = 10


def ended_turn_fraction(curve: list[tuple[int, float]]) -> dict[str, float | int] | None:
    """1 - the truncated-action fraction, averaged over the first and the last ``WINDOW`` steps."""
    if not curve:
        return None
    values = [1.0 - v for _, v in sorted(curve)]
    return {
        "first": sum(values[:WINDOW]) / len(values[:WINDOW]),
        "last": sum(values[-WINDOW:]) / len(values[-WINDOW:]),
        "window_steps": WINDOW,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run")
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--name", default="code_learn", choices=sorted(TITLES))
    args = parser.parse_args()
    curves = read_curve(args.run)
    summary_path = os.path.join(args.run, "summary.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    ended = ended_turn_fraction(curves["rollout/truncated_action_fraction"])
    result = {"summary": summary, "ended_turn_fraction": ended, "curves": curves}
    write_result(args.out, args.name, result)  # + command, commit, machine
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for key, style in (("val/pass_at_1", "o-"), ("val/pass_at_k", "s--")):
        xs, ys = zip(*curves[key]) if curves[key] else ((), ())
        ax.plot(xs, ys, style, label=f"held-out {key.split('/')[1]}")
    xs, ys = zip(*curves["rollout/reward_mean"]) if curves["rollout/reward_mean"] else ((), ())
    ax.plot(xs, ys, "-", alpha=0.35, label="train reward (per step)")
    ax.set_xlabel("optimizer step")
    ax.set_ylim(0, 1.02)
    ax.set_title(TITLES[args.name])
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, f"{args.name}.png"), dpi=110)
    keys = ("val_pass_at_1_first", "val_pass_at_1_last", "wall_seconds", "learner_idle_fraction", "steps")
    print(json.dumps({**{k: summary.get(k) for k in keys}, "ended_turn_fraction": ended}))


if __name__ == "__main__":
    main()
