"""``DIR/summary.json`` and ``DIR/reward_curve.png``: the numbers a run is judged by.

Written at the end of every ``fit`` by :class:`~thundersync_lightning.callbacks.RunSummary` from one
:class:`StepAggregate` per optimizer step, each reduced over all ranks; the aggregates travel in
the checkpoint, so a resumed run's summary covers every step since step 0.

Keys (fixed: scripts and outside checks read them): ``mode``, ``steps``, ``reward_mean_first``,
``reward_mean_last`` (mean reward over the first / last ``reward_window_steps`` steps),
``staleness_max``, ``engine_learner_kl_max`` (the largest per-step k3 estimate of
KL(engine || learner) over scored tokens; null where the strategy records none),
``learner_idle_fraction`` (idle seconds / step seconds, summed over steps and ranks),
``wall_seconds`` (every fit of the run), plus ``step_seconds_median``, ``trajectories``,
``reward_window_steps``, ``steps_this_fit`` (0 for a resume that ran no step),
``zero_advantage_group_fraction`` (groups whose rewards were all equal: no gradient),
``reward_error_fraction`` (trajectories whose reward could not be computed, counted as reward 0:
a reward or verdict failed, or a data row could not be an episode; null without trajectories),
``reward_error_first`` (the first such failure's reason, or null), ``unscorable_fraction``
(trajectories every reward declined with None, TRL's unscorable completions: out of the reward
means and their group's baseline; null without trajectories),
``reward_curve`` (the PNG's file name beside summary.json, or null) and ``stopped_by`` (null, or
the exception that ended the fit, e.g. ``KeyboardInterrupt``: an interrupted run is summarised too).
``val_pass_at_1_first`` / ``val_pass_at_1_last`` (``val/pass_at_1`` of the first and last validation run
during fit; null without validation), ``tool_calls``, ``tool_error_fraction`` and
``tool_timeout_fraction`` (tool calls whose tool raised or died / overran its deadline, over tool
calls; null without calls), ``tool_calls_run`` (the well-formed calls, whose tool ran) and
``tool_error_first`` (the first tool failure's reason, or null).
:func:`failed_run` says why a run learned from nothing (every reward or every tool call failed).
Run ``python -m thundersync_lightning.summary DIR/summary.json`` to print it.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .strategy.stats import StepStats

__all__ = ["StepAggregate", "aggregate", "summarize", "failed_run", "format_summary", "draw_reward_curve"]


@dataclass(frozen=True, slots=True)
class StepAggregate:
    """One optimizer step, over all ranks: sums, maxima and counts (JSON- and checkpoint-friendly)."""

    step: int
    reward_sum: float
    reward_count: int
    trajectories: int
    staleness_max: int
    wall_seconds: float  # the longest rank's step
    wall_sum: float  # summed over ranks
    busy_sum: float
    groups: int
    zero_advantage_groups: int
    engine_learner_kl: float | None = None  # already over all ranks where the strategy records it
    reward_errors: int = 0  # trajectories whose reward could not be computed (TrajectoryRecord.reward_error)
    tool_calls: int = 0
    invalid_tool_calls: int = 0  # malformed: the tool did not run
    tool_errors: int = 0  # calls whose tool raised or died (timeouts not included)
    tool_timeouts: int = 0  # calls whose tool overran its deadline
    unscorable: int = 0  # trajectories every reward declined (TrajectoryRecord.unscorable)

    @property
    def reward_mean(self) -> float | None:
        return self.reward_sum / self.reward_count if self.reward_count else None


def aggregate(stats: StepStats) -> StepAggregate:
    """One rank's step as an aggregate (what :class:`RunSummary` reduces over ranks)."""
    rewards = [t.reward for t in stats.trajectories if t.reward is not None and not t.unscorable]
    return StepAggregate(
        step=stats.step,
        reward_sum=float(sum(rewards)),
        reward_count=len(rewards),
        trajectories=len(stats.trajectories),
        staleness_max=stats.staleness_max,
        wall_seconds=stats.wall_seconds,
        wall_sum=stats.wall_seconds,
        busy_sum=stats.busy_seconds,
        groups=len(stats.group_rewards),
        zero_advantage_groups=stats.zero_advantage_groups,
        engine_learner_kl=getattr(stats, "engine_learner_kl", None),
        reward_errors=sum(t.reward_error for t in stats.trajectories),
        tool_calls=sum(t.tool_calls for t in stats.trajectories),
        invalid_tool_calls=sum(t.invalid_tool_calls for t in stats.trajectories),
        tool_errors=sum(t.tool_errors - t.tool_timeouts for t in stats.trajectories),
        tool_timeouts=sum(t.tool_timeouts for t in stats.trajectories),
        unscorable=sum(t.unscorable for t in stats.trajectories),
    )


def summarize(
    steps: Sequence[StepAggregate], mode: str, wall_seconds: float, window: int | None = None
) -> dict[str, Any]:
    """The summary of a run's per-step aggregates (already reduced over ranks)."""
    n = len(steps)
    window = window or max(1, min(10, n // 10 or 1))

    def mean_reward(chunk: Sequence[StepAggregate]) -> float | None:
        count = sum(s.reward_count for s in chunk)
        return sum(s.reward_sum for s in chunk) / count if count else None

    busy = sum(s.busy_sum for s in steps)
    total = sum(s.wall_sum for s in steps)
    groups = sum(s.groups for s in steps)
    trajectories = sum(s.trajectories for s in steps)
    calls = sum(s.tool_calls for s in steps)
    return {
        "mode": mode,
        "steps": n,
        "reward_mean_first": mean_reward(steps[:window]),
        "reward_mean_last": mean_reward(steps[-window:]),
        "reward_window_steps": window,
        "staleness_max": max((s.staleness_max for s in steps), default=0),
        "engine_learner_kl_max": max(
            (s.engine_learner_kl for s in steps if s.engine_learner_kl is not None), default=None
        ),
        "learner_idle_fraction": max(0.0, total - busy) / total if total > 0 else 0.0,
        "step_seconds_median": statistics.median(s.wall_seconds for s in steps) if steps else 0.0,
        "trajectories": trajectories,
        "zero_advantage_group_fraction": sum(s.zero_advantage_groups for s in steps) / groups
        if groups
        else None,
        "reward_error_fraction": sum(s.reward_errors for s in steps) / trajectories if trajectories else None,
        "unscorable_fraction": sum(s.unscorable for s in steps) / trajectories if trajectories else None,
        "tool_calls": calls,
        "tool_calls_run": calls - sum(s.invalid_tool_calls for s in steps),
        "tool_error_fraction": sum(s.tool_errors for s in steps) / calls if calls else None,
        "tool_timeout_fraction": sum(s.tool_timeouts for s in steps) / calls if calls else None,
        "wall_seconds": wall_seconds,
    }


def failed_run(summary: dict[str, Any]) -> str | None:
    """Why a finished run learned from nothing (every reward, or every tool call, failed), or None."""
    if summary.get("reward_error_fraction") == 1.0:
        return (
            f"every reward of the run's {summary['trajectories']} trajectories failed (reward_error_fraction "
            "1.0 in summary.json): the policy was trained on reward 0 alone. Fix the reward function or the "
            "environment's verdict (trajectories.jsonl has every failure: python -m "
            "thundersync_lightning.show DIR)"
        )
    calls, ran = summary.get("tool_calls") or 0, summary.get("tool_calls_run") or 0
    broken = (summary.get("tool_error_fraction") or 0.0) + (summary.get("tool_timeout_fraction") or 0.0)
    if ran and round(broken * calls) >= ran:
        first = summary.get("tool_error_first")
        return (
            f"every one of the run's {ran} tool calls that ran failed (tool_error_fraction "
            f"{summary.get('tool_error_fraction') or 0:.2f}, tool_timeout_fraction "
            f"{summary.get('tool_timeout_fraction') or 0:.2f} in "
            f"summary.json){f'; the first: {first}' if first else ''}. Fix the "
            "tools (or raise tool_timeout_s)"
        )
    return None


def draw_reward_curve(steps: Sequence[StepAggregate], path: str | Path, window: int = 10) -> Path | None:
    """Mean reward per step and its trailing ``window``-step mean, as a PNG (Agg, no display).

    Returns the path, or ``None`` when no step had a reward. Uses matplotlib's object API, so the
    global pyplot backend and figures of the caller are left alone.
    """
    points = [(s.step, s.reward_mean) for s in steps if s.reward_mean is not None]
    if not points:
        return None
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    xs = [x for x, _ in points]
    ys = [float(y) for _, y in points]
    smooth = [
        sum(ys[max(0, i - window + 1) : i + 1]) / len(ys[max(0, i - window + 1) : i + 1])
        for i in range(len(ys))
    ]
    fig = Figure(figsize=(6, 3.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(xs, ys, ".", color="tab:blue", alpha=0.35, label="mean reward of the step")
    ax.plot(xs, smooth, "-", color="tab:blue", label=f"trailing {window}-step mean")
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out


def format_summary(summary: dict[str, Any], directory: str | Path | None = None) -> str:
    """The summary as text; ``directory`` (where summary.json lives) resolves the curve's path."""

    def num(v: Any, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    lines = [
        f"thundersync-lightning run summary ({summary['mode']} mode)",
        f"  steps                  {summary['steps']}",
        f"  mean reward            {num(summary['reward_mean_first'], '.3f')} (first "
        f"{summary.get('reward_window_steps', 1)} steps) -> {num(summary['reward_mean_last'], '.3f')} (last)",
        f"  staleness max          {summary['staleness_max']}",
        f"  engine-learner KL max  {num(summary.get('engine_learner_kl_max'), '.2e')}",
        f"  learner idle fraction  {summary['learner_idle_fraction']:.1%}",
        f"  median step            {summary.get('step_seconds_median', 0.0):.3f} s",
        f"  wall time              {summary['wall_seconds']:.1f} s",
    ]
    if summary.get("stopped_by"):
        lines.append(f"  stopped by             {summary['stopped_by']}")
    if summary.get("val_pass_at_1_first") is not None:
        lines.append(
            f"  val pass@1             {summary['val_pass_at_1_first']:.3f} (first) -> "
            f"{summary['val_pass_at_1_last']:.3f} (last)"
        )
    if summary.get("zero_advantage_group_fraction") is not None:
        lines.append(
            "  zero-advantage groups  "
            f"{summary['zero_advantage_group_fraction']:.1%} (equal rewards: no gradient)"
        )
    if summary.get("reward_error_fraction"):
        lines.append(
            f"  reward errors          {summary['reward_error_fraction']:.1%} of trajectories (reward 0: the "
            "reward function or verdict failed, or a data row could not be an "
            "episode; see trajectories.jsonl)"
            + (f"; the first: {summary['reward_error_first']}" if summary.get("reward_error_first") else "")
        )
    if summary.get("unscorable_fraction"):
        lines.append(
            f"  unscorable             {summary['unscorable_fraction']:.1%} of trajectories (every reward "
            "returned None: no reward, advantage 0)"
        )
    if summary.get("tool_calls") and (
        summary.get("tool_error_fraction") or summary.get("tool_timeout_fraction")
    ):
        lines.append(
            f"  tool failures          {summary['tool_error_fraction']:.1%} raised, "
            f"{summary['tool_timeout_fraction']:.1%} timed out of {summary['tool_calls']} calls; the first: "
            f"{summary.get('tool_error_first')}"
        )
    if summary.get("reward_curve"):
        curve = (
            Path(directory) / summary["reward_curve"]
            if directory is not None
            else Path(summary["reward_curve"])
        )
        lines.append(f"  reward curve           {curve}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m thundersync_lightning.summary DIR/summary.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    print(format_summary(json.loads(path.read_text()), path.parent))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
