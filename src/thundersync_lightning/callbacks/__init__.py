"""Observability for streaming GRPO: Lightning callbacks that read ``strategy.last_step_stats``.

Every metric key, its unit and how it is reduced across ranks: ``docs/metrics.md``. What a run
gets by default (in Python ``callbacks=default_callbacks()``; the CLI configs list the same):
``docs/metrics.md`` ("Enabling them").
"""

from lightning.pytorch.callbacks import Callback

from thundersync_lightning.callbacks.flops import PEAK_FLOPS_TABLE, PeakFlops, resolve_peak_flops
from thundersync_lightning.callbacks.idle import IdleTimeMonitor, draw_timeline, read_timeline
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


def default_callbacks(progress_bar: bool = True, trajectories_per_step: int = 4) -> list[Callback]:
    """What every run should have, as the CLI's configs give it: the rollout progress bar, one of
    each monitor, decoded trajectories (``DIR/trajectories.jsonl``), ``DIR/summary.json`` with the
    reward curve, and the run checks (W&B resume, warnings).

    Args:
        progress_bar: include :class:`RolloutProgressBar`; pass False with
            ``Trainer(enable_progress_bar=False)`` (Lightning refuses a progress bar callback then).
        trajectories_per_step: trajectories :class:`TrajectoryLogger` decodes per step (0: none).
    """
    callbacks: list[Callback] = [RolloutProgressBar()] if progress_bar else []
    callbacks += [StalenessMonitor(), MFUMonitor(), MemoryMonitor(), IdleTimeMonitor(), RolloutMetrics()]
    if trajectories_per_step > 0:
        callbacks.append(TrajectoryLogger(num_per_step=trajectories_per_step))
    return [*callbacks, RunSummary(), RunChecks()]
