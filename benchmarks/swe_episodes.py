"""What a SWE-bench run's episodes did: resolved rate, episode-time distribution, phases, learner idle.

Reads a run directory of ``configs/swebench_cpu.yaml`` (``make demo-swe``): ``episodes.jsonl``
(one line per episode, :mod:`thundersync_lightning.envs.swebench.episodes`), ``trajectories.jsonl``
(the TrajectoryLogger's lines: scored tokens) and ``summary.json`` (the learner idle fraction), and

- adds a ``swebench`` section to ``summary.json``: ``episodes``, ``resolved_rate`` (resolved /
  episodes that reached a verdict), ``reward_mean``, ``episode_seconds`` (min, p10, median, p90,
  max, mean), the phases' medians and means (``container_start_s``, ``commands_s``, ``verdict_s``,
  ``generation_s`` = the rest of the episode: the policy's generation and the waits between
  turns), ``commands_per_episode_mean``, ``verdicts`` (count per reason), ``errors`` and
  ``learner_idle_fraction`` (the run's, from summary.json);
- writes ``swe_trace.json``: one replay-trace row per episode (``rollout/replay.py``'s format, in
  seconds): ``content_ready`` = the verdict's start (episode start -> last action), ``reward_ready``
  = the episode's end, ``scored_tokens`` = the policy's tokens of that trajectory (joined through the
  per-trajectory seed ``derive_seed(data_seed, step, group, sample)``; the episode's action budget
  where the trajectory is not in trajectories.jsonl).

Usage: python benchmarks/swe_episodes.py runs/demo-swe [--data-seed 0] [--max-action-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import Counter
from typing import Any

from thundersync_lightning.core.types import derive_seed
from thundersync_lightning.envs.swebench.episodes import read_episodes

__all__ = ["episode_summary", "trace_rows", "main"]

PHASES = ("container_start_s", "commands_s", "verdict_s", "generation_s")


def _quantile(xs: list[float], q: float) -> float:
    """The q-quantile by linear interpolation between order statistics (numpy's default)."""
    s = sorted(xs)
    pos = q * (len(s) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def distribution(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {
        "min": min(xs),
        "p10": _quantile(xs, 0.1),
        "median": statistics.median(xs),
        "p90": _quantile(xs, 0.9),
        "max": max(xs),
        "mean": statistics.fmean(xs),
    }


def _generation(e: dict[str, Any]) -> float:
    phases = (e.get("container_start_s") or 0.0) + (e.get("commands_s") or 0.0) + (e.get("verdict_s") or 0.0)
    return max(0.0, (e.get("episode_s") or 0.0) - phases)


def episode_summary(episodes: list[dict[str, Any]], learner_idle_fraction: float | None) -> dict[str, Any]:
    """The ``swebench`` section of summary.json (module docstring)."""
    graded = [e for e in episodes if e.get("reward") is not None]
    times = [e["episode_s"] for e in episodes if e.get("episode_s") is not None]
    phases = {"generation_s": [_generation(e) for e in episodes if e.get("episode_s") is not None]}
    for key in PHASES[:3]:
        phases[key] = [float(e[key]) for e in episodes if e.get(key) is not None]
    return {
        "episodes": len(episodes),
        "graded": len(graded),
        "resolved": sum(bool(e.get("resolved")) for e in graded),
        "resolved_rate": sum(bool(e.get("resolved")) for e in graded) / len(graded) if graded else None,
        "reward_mean": statistics.fmean(e["reward"] for e in graded) if graded else None,
        "episode_seconds": distribution(times),
        "phase_seconds_median": {k: statistics.median(v) for k, v in phases.items() if v},
        "phase_seconds_mean": {k: statistics.fmean(v) for k, v in phases.items() if v},
        "commands_per_episode_mean": statistics.fmean(e.get("commands", 0) for e in episodes)
        if episodes
        else None,
        "verdicts": dict(Counter(str(e.get("verdict")) for e in episodes).most_common()),
        "errors": [e["error"] for e in episodes if e.get("error")][:20],
        "learner_idle_fraction": learner_idle_fraction,
    }


def scored_tokens(trajectories: list[dict[str, Any]], data_seed: int) -> dict[int, int]:
    """Per-trajectory seed -> scored tokens, for the trajectories the logger wrote."""
    out = {}
    for t in trajectories:
        _, g, k = t["trajectory_id"].split("-")
        seed = derive_seed(data_seed, int(t["step"]), int(g[1:]), int(k[1:]))
        out[seed] = sum(len(s["ids"]) for s in t.get("segments", ()) if s.get("scored"))
    return out


def trace_rows(
    episodes: list[dict[str, Any]], tokens: dict[int, int], default_tokens: int
) -> list[dict[str, Any]]:
    """One replay-trace row per episode that ran to its end (seconds; module docstring)."""
    rows = []
    for e in episodes:
        if e.get("episode_s") is None:
            continue
        end = float(e["episode_s"])
        rows.append(
            {
                "content_ready": max(0.0, end - float(e.get("verdict_s") or 0.0)),
                "reward_ready": end,
                "scored_tokens": max(1, tokens.get(int(e["seed"]), default_tokens)),
                "instance_id": e["instance_id"],
            }
        )
    return rows


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    if not os.path.isfile(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir")
    p.add_argument(
        "--data-seed", type=int, default=0, help="the run's data.seed (joins episodes to trajectories)"
    )
    p.add_argument(
        "--max-action-tokens", type=int, default=48, help="tokens of an episode not in trajectories.jsonl"
    )
    args = p.parse_args(argv)
    path = os.path.join(args.run_dir, "episodes.jsonl")
    if not os.path.isfile(path):
        sys.exit(
            f"{path} does not exist: run with data.tasks.init_args.episode_log "
            "set (configs/swebench_cpu.yaml)"
        )
    episodes = read_episodes(path)
    summary_path = os.path.join(args.run_dir, "summary.json")
    summary = json.load(open(summary_path)) if os.path.isfile(summary_path) else {}
    section = episode_summary(episodes, summary.get("learner_idle_fraction"))
    summary["swebench"] = section
    with open(summary_path, "w") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
        f.write("\n")
    tokens = scored_tokens(_read_jsonl(os.path.join(args.run_dir, "trajectories.jsonl")), args.data_seed)
    rows = trace_rows(episodes, tokens, args.max_action_tokens)
    with open(os.path.join(args.run_dir, "swe_trace.json"), "w") as f:
        json.dump({"unit": "seconds", "source": os.path.abspath(path), "rows": rows}, f, indent=1)
        f.write("\n")
    dist = section["episode_seconds"] or {}
    rate = section["resolved_rate"]
    idle = section["learner_idle_fraction"]
    print(f"SWE-bench episodes   {section['episodes']} ({section['graded']} graded by swebench)")
    print(f"resolved rate        {'n/a' if rate is None else f'{rate:.1%}'} ({section['resolved']} resolved)")
    if dist:
        print(
            f"episode seconds      median {dist['median']:.1f}  p90 {dist['p90']:.1f}  max {dist['max']:.1f}"
        )
    print(
        "phase medians (s)    "
        + "  ".join(f"{k[:-2]} {v:.1f}" for k, v in section["phase_seconds_median"].items())
    )
    print(f"learner idle         {'n/a' if idle is None else f'{idle:.1%}'}")
    print(f"wrote {summary_path} (swebench section) and {os.path.join(args.run_dir, 'swe_trace.json')}")
    return section


if __name__ == "__main__":
    main()
