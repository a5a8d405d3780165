"""RolloutProgressBar: Lightning's TQDM bar plus live rollout progress inside the current step.

The strategy pushes a :class:`RolloutProgress` to every callback that defines
``on_rollout_progress`` (throttled, and once at the barrier); the bar shows it as postfix items::

    Epoch 0:  3/10 [00:04, traj=12/32, rew=10/32, open=3, idle=0.8s (21%)]
"""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from typing_extensions import override

from thundersync_lightning.strategy.stats import RolloutProgress

__all__ = ["RolloutProgressBar", "progress_items"]

log = logging.getLogger(__name__)


def progress_items(progress: RolloutProgress) -> dict[str, str | int]:
    """The postfix items for one progress report: trajectories with content / total, with reward /
    total, open groups, idle seconds and their share of the step so far."""
    total = progress.trajectories_total
    share = progress.idle_seconds / progress.elapsed_seconds if progress.elapsed_seconds > 0 else 0.0
    return {
        "traj": f"{progress.content_ready}/{total}",
        "rew": f"{progress.reward_ready}/{total}",
        "open": progress.open_groups,
        "idle": f"{progress.idle_seconds:.1f}s ({share:.0%})",
    }


class RolloutProgressBar(TQDMProgressBar):
    """A :class:`~lightning.pytorch.callbacks.TQDMProgressBar` that also shows rollout progress."""

    def __init__(self, refresh_rate: int = 1, process_position: int = 0, leave: bool = False) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position, leave=leave)
        self._progress: RolloutProgress | None = None

    @property
    def rollout_progress(self) -> RolloutProgress | None:
        """The latest report received (``None`` before the first)."""
        return self._progress

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
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        items = super().get_metrics(trainer, pl_module)
        if self._progress is not None:
            items.update(progress_items(self._progress))
        return items
