"""RolloutProgressBar: Lightning's TQDM bar plus live rollout progress and the last step's reward.

The strategy pushes a :class:`RolloutProgress` to every callback that defines
``on_rollout_progress`` (throttled, and once at the barrier); the bar shows it as postfix items,
with the mean reward of the last finished step::

    Epoch 0:  3/10 [00:04, reward=0.438, traj=12/32, verdicts=10/32, open=3, idle=0.8s (21%)]

``verdicts`` counts trajectories whose reward has arrived (not a score). Without a terminal
(``sys.stdout`` is not a tty: a log file, CI, a notebook's captured output) the bar prints one line
per step instead of ``\\r`` updates::

    step 2 (3/300)  reward=0.438  loss=-0.0123  trajectories=128  idle=0.8s (21%)  staleness=0  step=1.21s

The step is numbered from 0, as everywhere else (``trainer.global_step`` before the step,
``trajectories.jsonl``, ``show``, W&B's x axis); in brackets, how many of ``max_steps`` are done.

The reward shown is the mean over this rank's trajectories (rank 0's share of the groups when
several devices train; ``rollout/reward_mean`` of :class:`RolloutMetrics` covers all ranks).
With ``Trainer(enable_progress_bar=False)`` leave the bar out (``default_callbacks(progress_bar=False)``);
the CLI drops it by itself.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm
from typing_extensions import override

from ..strategy.stats import RolloutProgress, StepStats
from .base import StepStatsReader

__all__ = ["RolloutProgressBar", "progress_items", "step_line", "mean_reward"]

log = logging.getLogger(__name__)


def mean_reward(stats: StepStats) -> float | None:
    """Mean of the step's known rewards on this rank (``None`` if none arrived)."""
    rewards = [t.reward for t in stats.trajectories if t.reward is not None]
    return sum(rewards) / len(rewards) if rewards else None


def progress_items(progress: RolloutProgress) -> dict[str, str | int]:
    """The postfix items for one progress report: trajectories with content / total, with a
    verdict (reward arrived) / total, open groups, idle seconds and their share of the step so far."""
    total = progress.trajectories_total
    share = progress.idle_seconds / progress.elapsed_seconds if progress.elapsed_seconds > 0 else 0.0
    return {
        "traj": f"{progress.content_ready}/{total}",
        "verdicts": f"{progress.reward_ready}/{total}",
        "open": progress.open_groups,
        "idle": f"{progress.idle_seconds:.1f}s ({share:.0%})",
    }


def step_line(stats: StepStats, max_steps: int | None = None) -> str:
    """The one line printed per step without a terminal: ``step K (K+1/max_steps)``, K from 0."""
    reward = mean_reward(stats)
    done = f" ({stats.step + 1}/{max_steps})" if max_steps is not None and max_steps > 0 else ""
    return (
        f"step {stats.step}{done}  reward={'n/a' if reward is None else format(reward, '.3f')}  "
        f"loss={stats.loss:.4g}  trajectories={len(stats.trajectories)}  "
        f"idle={stats.idle_seconds:.1f}s ({stats.idle_fraction:.0%})  staleness={stats.staleness_max}  "
        f"step={stats.wall_seconds:.2f}s"
    )


class RolloutProgressBar(TQDMProgressBar):
    """A :class:`~lightning.pytorch.callbacks.TQDMProgressBar` that also shows rollout progress.

    Args:
        refresh_rate, process_position, leave: as in ``TQDMProgressBar`` (in line mode a line is
            printed every ``refresh_rate`` steps).
        lines: print one line per step instead of a live bar; ``None``: when ``sys.stdout`` is not
            a terminal.
    """

    def __init__(
        self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False, lines: bool | None = None
    ) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        self.lines = lines
        self._progress: RolloutProgress | None = None
        self._reward: float | None = None
        self._read_stats = StepStatsReader(type(self).__name__)

    @property
    def line_mode(self) -> bool:
        return (not sys.stdout.isatty()) if self.lines is None else self.lines

    @property
    def rollout_progress(self) -> RolloutProgress | None:
        """The latest report received (``None`` before the first)."""
        return self._progress

    @property
    def last_reward(self) -> float | None:
        """Mean reward of the last finished step on this rank."""
        return self._reward

    @override
    def init_train_tqdm(self) -> Tqdm:
        if self.line_mode:  # a bar that draws nothing; lines are printed at each step's end
            return Tqdm(disable=True, file=sys.stdout)
        return super().init_train_tqdm()

    @override
    def init_sanity_tqdm(self) -> Tqdm:
        if self.line_mode:  # in a log, a redrawn bar is a line of control characters
            return Tqdm(disable=True, file=sys.stdout)
        return super().init_sanity_tqdm()

    @override
    def init_validation_tqdm(self) -> Tqdm:
        if self.line_mode:
            return Tqdm(disable=True, file=sys.stdout)
        return super().init_validation_tqdm()

    def on_rollout_progress(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, progress: RolloutProgress
    ) -> None:
        self._progress = progress
        if not self.is_enabled:
            return
        try:
            bar = self.train_progress_bar
        except TypeError:  # not inside the training loop
            return
        bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=True)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stats = self._read_stats(trainer)
        if stats is not None:
            self._reward = mean_reward(stats)
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if (
            stats is not None
            and self.line_mode
            and self.is_enabled
            and (stats.step + 1) % self.refresh_rate == 0
        ):
            print(step_line(stats, trainer.max_steps), flush=True)

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        if self._reward is not None:
            items["reward"] = f"{self._reward:.3f}"
        if self._progress is not None:
            items.update(progress_items(self._progress))
        return items
