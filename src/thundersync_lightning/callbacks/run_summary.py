"""RunSummary: ``DIR/summary.json`` and ``DIR/reward_curve.png`` for every fit, over all ranks and
every step of the run (also across resumes).

At each step every rank adds its :class:`StepStats` to torchmetrics aggregators that are reduced
over ranks (a collective, like the monitors'), giving one :class:`StepAggregate` per step. The list
is the callback's ``state_dict``, so it is saved in every checkpoint and restored on resume: the
summary written at the end of a resumed fit covers the steps before the checkpoint too. Rank 0
writes the files. ``DIR`` is ``trainer.default_root_dir`` unless ``path`` is given.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

from ..core.errors import RunFailed
from ..strategy.stats import StepStats
from ..summary import StepAggregate, aggregate, draw_reward_curve, failed_run, format_summary, summarize
from .base import Max, Reduction, StepStatsCallback, Sum

__all__ = ["RunSummary"]

log = logging.getLogger(__name__)

_REDUCTIONS: dict[str, type[Sum] | type[Max]] = {
    "reward_sum": Sum,
    "reward_count": Sum,
    "trajectories": Sum,
    "staleness_max": Max,
    "wall_seconds": Max,
    "wall_sum": Sum,
    "busy_sum": Sum,
    "groups": Sum,
    "zero_advantage_groups": Sum,
    "reward_errors": Sum,
    "tool_calls": Sum,
    "invalid_tool_calls": Sum,
    "tool_errors": Sum,
    "tool_timeouts": Sum,
    "unscorable": Sum,
}


class RunSummary(StepStatsCallback):
    """Write ``summary.json`` (see :mod:`thundersync_lightning.summary`) and the reward curve.

    Args:
        path: where summary.json goes (default ``<trainer.default_root_dir>/summary.json``); the
            curve goes beside it as ``reward_curve.png``.
        window: steps averaged for ``reward_mean_first`` / ``reward_mean_last`` (default: a tenth
            of the run, 1 to 10).
        reward_curve: draw the PNG.
        print_summary: print the summary (and the curve's path) on rank 0 when fit ends.
        fail_empty_runs: a fit in which every reward or every tool call failed raises
            :class:`~thundersync_lightning.core.errors.RunFailed` after writing the summary (a non-zero
            exit that says why) instead of ending as if it had trained.
    """

    log_metrics = False  # the per-step sums feed summary.json; the monitors log their own keys

    def __init__(
        self,
        path: str | None = None,
        window: int | None = None,
        reward_curve: bool = True,
        print_summary: bool = True,
        fail_empty_runs: bool = True,
    ) -> None:
        self.fail_empty_runs = fail_empty_runs
        self.path = path
        self.window = window
        self.reward_curve = reward_curve
        self.print_summary = print_summary
        self.steps: list[StepAggregate] = []
        self._wall_before = 0.0  # seconds of the fits before a resume
        self._start = time.monotonic()
        self._steps_before = 0
        self._training = False  # on_train_start seen: an exception before it (set-up) writes nothing
        super().__init__()
        self.val_pass_at_1: list[float] = []  # val/pass_at_1 of every validation run during fit
        self.tool_error_first: str | None = None  # this rank's first tool failure
        self.reward_error_first: str | None = None  # this rank's first reward error (a failed row included)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":  # a checkpoint, if any, is loaded after this (load_state_dict)
            self.steps, self._wall_before, self._steps_before = [], 0.0, 0
            self.val_pass_at_1 = []
            self.tool_error_first = None
            self.reward_error_first = None
            self._training = False

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        value = trainer.callback_metrics.get("val/pass_at_1")
        if value is not None and not trainer.sanity_checking and trainer.state.fn == "fit":
            self.val_pass_at_1.append(float(value))

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.monotonic()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._training = True

    @override
    def measure(self, stats: StepStats) -> dict[str, Reduction]:
        if self.tool_error_first is None:
            self.tool_error_first = next((t.tool_error for t in stats.trajectories if t.tool_error), None)
        if self.reward_error_first is None:
            self.reward_error_first = next((t.failure for t in stats.trajectories if t.reward_error), None)
        local = aggregate(stats)
        return {name: reduction(float(getattr(local, name))) for name, reduction in _REDUCTIONS.items()}

    @override
    def derive(self, reduced: dict[str, float], stats: StepStats) -> dict[str, float]:
        return reduced  # not logged (log_metrics is False): after_metrics keeps them per step

    @override
    def after_metrics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, stats: StepStats, metrics: dict[str, float]
    ) -> None:
        counts = {f.name for f in fields(StepAggregate) if f.type == "int"}
        self.steps.append(
            StepAggregate(
                step=stats.step,
                engine_learner_kl=stats.engine_learner_kl,  # the strategy already reduced it
                **{k: (int(v) if k in counts else v) for k, v in metrics.items()},
            )
        )

    @property
    def wall_seconds(self) -> float:
        """Seconds of every fit of the run so far."""
        return self._wall_before + time.monotonic() - self._start

    def summary(self, mode: str) -> dict[str, Any]:
        out = summarize(self.steps, mode, self.wall_seconds, self.window)
        out["steps_this_fit"] = len(self.steps) - self._steps_before
        out["val_pass_at_1_first"] = self.val_pass_at_1[0] if self.val_pass_at_1 else None
        out["val_pass_at_1_last"] = self.val_pass_at_1[-1] if self.val_pass_at_1 else None
        out["tool_error_first"] = self.tool_error_first
        out["reward_error_first"] = self.reward_error_first
        return out

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": [asdict(s) for s in self.steps],
            "wall_seconds": self.wall_seconds,
            "val_pass_at_1": list(self.val_pass_at_1),
            "tool_error_first": self.tool_error_first,
            "reward_error_first": self.reward_error_first,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = [StepAggregate(**s) for s in state_dict.get("steps", [])]
        self._steps_before = len(self.steps)
        self._wall_before = float(state_dict.get("wall_seconds", 0.0))
        self.val_pass_at_1 = [float(v) for v in state_dict.get("val_pass_at_1", [])]
        self.tool_error_first = state_dict.get("tool_error_first")
        self.reward_error_first = state_dict.get("reward_error_first")

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.write(trainer)
        mode = getattr(trainer.strategy, "mode", type(trainer.strategy).__name__)
        problem = failed_run(self.summary(mode)) if self.fail_empty_runs else None
        if problem is not None:  # the same on every rank: the aggregates are reduced over ranks
            raise RunFailed(problem)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        # an interrupted run (Ctrl-C, a failure) still leaves the summary of the steps it ran; an error
        # at set-up (a ConfigError) ran none and leaves an earlier summary alone
        if self._training:
            self.write(trainer, stopped_by=type(exception).__name__)

    @rank_zero_only
    def write(self, trainer: pl.Trainer, stopped_by: str | None = None) -> Path:
        """Write summary.json (and the curve) on rank 0; returns summary.json's path.

        ``stopped_by`` (the exception's type name, or null for a finished fit) is recorded too."""
        mode = getattr(trainer.strategy, "mode", type(trainer.strategy).__name__)
        summary = self.summary(mode)
        summary["stopped_by"] = stopped_by
        path = Path(self.path or Path(trainer.default_root_dir) / "summary.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        summary["reward_curve"] = None
        if self.reward_curve:
            try:
                curve = draw_reward_curve(self.steps, path.parent / "reward_curve.png")
            except ImportError as err:  # matplotlib is a dependency; a broken install only loses the plot
                log.warning("RunSummary: no reward curve (%s)", err)
                curve = None
            summary["reward_curve"] = curve.name if curve is not None else None
        path.write_text(json.dumps(summary, indent=2) + "\n")
        if self.print_summary:
            print(format_summary(summary, path.parent), flush=True)
            print(f"  summary                {path}", flush=True)
        return path
