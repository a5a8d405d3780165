"""Observability for streaming GRPO: Lightning callbacks that read ``strategy.last_step_stats``.

Every metric key, its unit and how it is reduced across ranks: ``docs/metrics.md``. What a run
gets by default (in Python ``callbacks=default_callbacks()``; the CLI configs list the same):
``docs/metrics.md`` ("Enabling them"). A monitor of your own subclasses :class:`StepStatsCallback`
(``measure`` a step's ``StepStats`` into values that say how they reduce over ranks: :class:`Mean`,
:class:`Sum`, :class:`Max`); docs/design.md, "Adding a metric".
"""

from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from thundersync_lightning.callbacks.base import (
    Max,
    Mean,
    Reduction,
    StepReducer,
    StepStatsCallback,
    StepStatsReader,
    Sum,
)
from thundersync_lightning.callbacks.flops import PEAK_FLOPS_TABLE, PeakFlops, resolve_peak_flops
from thundersync_lightning.callbacks.idle import IdleTimeMonitor, draw_timeline, read_timeline
from thundersync_lightning.callbacks.interrupt import InterruptCheckpoint, last_checkpoint_path
from thundersync_lightning.callbacks.loggers import (
    ThunderSyncWandbLogger,
    default_wandb_logger,
    wandb_run_id_from_checkpoint,
)
from thundersync_lightning.callbacks.memory import MemoryMonitor
from thundersync_lightning.callbacks.mfu import MFUMonitor
from thundersync_lightning.callbacks.progress import RolloutProgressBar
from thundersync_lightning.callbacks.rollout_metrics import RolloutMetrics
from thundersync_lightning.callbacks.run_checks import RunChecks
from thundersync_lightning.callbacks.run_summary import RunSummary
from thundersync_lightning.callbacks.staleness import StalenessMonitor
from thundersync_lightning.callbacks.trajectories import TrajectoryLogger, read_trajectories
from thundersync_lightning.callbacks.validate_start import ValidateAtStart

__all__ = [
    "StepStatsCallback",
    "StepStatsReader",
    "StepReducer",
    "Reduction",
    "Mean",
    "Sum",
    "Max",
    "StalenessMonitor",
    "MFUMonitor",
    "MemoryMonitor",
    "IdleTimeMonitor",
    "RolloutMetrics",
    "RolloutProgressBar",
    "RunSummary",
    "RunChecks",
    "TrajectoryLogger",
    "ValidateAtStart",
    "InterruptCheckpoint",
    "last_checkpoint_path",
    "ThunderSyncWandbLogger",
    "default_wandb_logger",
    "default_callbacks",
    "wandb_run_id_from_checkpoint",
    "PeakFlops",
    "PEAK_FLOPS_TABLE",
    "resolve_peak_flops",
    "read_timeline",
    "draw_timeline",
    "read_trajectories",
]


def default_callbacks(
    progress_bar: bool = True, trajectories_per_step: int = 4, checkpoint_every_n_steps: int | None = 50
) -> list[Callback]:
    """What every run should have, as the CLI's configs give it: the rollout progress bar, one of
    each monitor, decoded trajectories (``DIR/trajectories.jsonl``), ``DIR/summary.json`` with the
    reward curve, the run checks (W&B resume, warnings) and checkpoints: ``DIR/checkpoints/last.ckpt``
    every ``checkpoint_every_n_steps`` steps, on Ctrl-C or an exception, and at the end of the fit
    (:class:`InterruptCheckpoint`).

    Args:
        progress_bar: include :class:`RolloutProgressBar`; pass False with
            ``Trainer(enable_progress_bar=False)`` (Lightning refuses a progress bar callback then).
        trajectories_per_step: trajectories :class:`TrajectoryLogger` decodes per step (0: none).
        checkpoint_every_n_steps: steps between periodic checkpoints; ``None``: no checkpoint
            callbacks at all (for ``Trainer(enable_checkpointing=False)``, which refuses them).
    """
    callbacks: list[Callback] = [RolloutProgressBar()] if progress_bar else []
    callbacks += [StalenessMonitor(), MFUMonitor(), MemoryMonitor(), IdleTimeMonitor(), RolloutMetrics()]
    if trajectories_per_step > 0:
        callbacks.append(TrajectoryLogger(num_per_step=trajectories_per_step))
    callbacks += [RunSummary(), RunChecks()]
    if checkpoint_every_n_steps is not None:
        callbacks += [
            ModelCheckpoint(save_last=True, every_n_train_steps=checkpoint_every_n_steps),
            InterruptCheckpoint(),
        ]
    return callbacks
