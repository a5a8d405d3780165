"""``DIR/summary.json``: the numbers a run is judged by, written at the end of ``fit``.

Keys (fixed: scripts and outside checks read them): ``mode``, ``steps``, ``reward_mean_first``,
``reward_mean_last`` (mean reward over the first / last ``reward_window_steps`` steps),
``staleness_max``, ``engine_learner_kl_max`` (the largest per-step k3 estimate of
KL(engine || learner) over scored tokens; null without engine logprobs), ``learner_idle_fraction`` (idle seconds / step seconds, summed over steps),
``wall_seconds`` (the whole fit), plus ``step_seconds_median``, ``trajectories`` and
``reward_window_steps``; ``val_pass_at_1_first`` / ``val_pass_at_1_last`` (``val/pass_at_1`` of the
first and last validation run during fit; null without validation). Run ``python -m thundersync_lightning.summary DIR/summary.json`` to print it.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

from .strategy.stats import StepStats

__all__ = ["RunSummary", "summarize", "format_summary"]


def summarize(stats: list[StepStats], mode: str, wall_seconds: float, window: int | None = None) -> dict[str, Any]:
    """The summary of a list of per-step statistics (one rank)."""
    steps = len(stats)
    window = window or max(1, min(10, steps // 10 or 1))

    def mean_reward(chunk: list[StepStats]) -> float | None:
        values = [t.reward for s in chunk for t in s.trajectories if t.reward is not None]
        return sum(values) / len(values) if values else None

    busy = sum(s.busy_seconds for s in stats)
    total = sum(s.wall_seconds for s in stats)
    return {
        "mode": mode,
        "steps": steps,
        "reward_mean_first": mean_reward(stats[:window]),
        "reward_mean_last": mean_reward(stats[-window:]),
        "reward_window_steps": window,
        "staleness_max": max((s.staleness_max for s in stats), default=0),
        "learner_idle_fraction": max(0.0, total - busy) / total if total > 0 else 0.0,
        "step_seconds_median": statistics.median(s.wall_seconds for s in stats) if stats else 0.0,
        "trajectories": sum(len(s.trajectories) for s in stats),
        "engine_learner_kl_max": max(
            (s.engine_learner_kl for s in stats if s.engine_learner_kl is not None), default=None
        ),
        "wall_seconds": wall_seconds,
    }


class RunSummary(Callback):
    """Collects every step's :class:`StepStats` and writes ``summary.json`` when fit ends."""

    def __init__(self, path: str | None = None, window: int | None = None) -> None:
        self.path = path
        self.window = window
        self.stats: list[StepStats] = []
        self.val_pass_at_1: list[float] = []
        self._start = 0.0

    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = time.monotonic()
        self.stats = []
        self.val_pass_at_1 = []

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        value = trainer.callback_metrics.get("val/pass_at_1")
        if value is not None and not trainer.sanity_checking and trainer.state.fn == "fit":
            self.val_pass_at_1.append(float(value))

    @override
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any, **kwargs: Any) -> None:
        stats = getattr(trainer.strategy, "last_step_stats", None)
        if stats is not None and (not self.stats or self.stats[-1] is not stats):
            self.stats.append(stats)

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.write(trainer)

    @rank_zero_only
    def write(self, trainer: Trainer) -> None:
        mode = getattr(trainer.strategy, "mode", type(trainer.strategy).__name__)
        summary = summarize(self.stats, mode, time.monotonic() - self._start, self.window)
        summary["val_pass_at_1_first"] = self.val_pass_at_1[0] if self.val_pass_at_1 else None
        summary["val_pass_at_1_last"] = self.val_pass_at_1[-1] if self.val_pass_at_1 else None
        path = Path(self.path or os.path.join(trainer.default_root_dir, "summary.json"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=2) + "\n")


def format_summary(summary: dict[str, Any]) -> str:
    def num(v: Any, fmt: str) -> str:
        return "n/a" if v is None else format(v, fmt)

    lines = [
        f"thundersync-lightning run summary ({summary['mode']} mode)",
        f"  steps                  {summary['steps']}",
        f"  mean reward            {num(summary['reward_mean_first'], '.3f')} (first {summary.get('reward_window_steps', 1)} steps)"
        f" -> {num(summary['reward_mean_last'], '.3f')} (last)",
        f"  staleness max          {summary['staleness_max']}",
        f"  engine-learner KL max  {num(summary.get('engine_learner_kl_max'), '.2e')}",
        f"  learner idle fraction  {summary['learner_idle_fraction']:.1%}",
        f"  median step            {summary.get('step_seconds_median', 0.0):.3f} s",
        f"  wall time              {summary['wall_seconds']:.1f} s",
    ]
    if summary.get("val_pass_at_1_first") is not None:
        lines.append(f"  val pass@1             {summary['val_pass_at_1_first']:.3f} (first) -> "
                     f"{summary['val_pass_at_1_last']:.3f} (last)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m thundersync_lightning.summary DIR/summary.json", file=sys.stderr)
        return 2
    print(format_summary(json.loads(Path(args[0]).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
