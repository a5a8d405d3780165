"""Observability for streaming GRPO: Lightning callbacks that read ``strategy.last_step_stats``.

Every metric key, its unit and how it is reduced across ranks: ``docs/metrics.md``.
"""

from lightning.pytorch.callbacks import Callback

from thundersync_lightning.callbacks.flops import PEAK_FLOPS_TABLE, PeakFlops, resolve_peak_flops
from thundersync_lightning.callbacks.idle import IdleTimeMonitor, draw_timeline, read_timeline
from thundersync_lightning.callbacks.loggers import ThunderSyncWandbLogger, default_wandb_logger
from thundersync_lightning.callbacks.memory import MemoryMonitor
from thundersync_lightning.callbacks.mfu import MFUMonitor
from thundersync_lightning.callbacks.progress import RolloutProgressBar
from thundersync_lightning.callbacks.rollout_metrics import RolloutMetrics
from thundersync_lightning.callbacks.staleness import StalenessMonitor
from thundersync_lightning.callbacks.validate_start import ValidateAtStart

__all__ = [
    "StalenessMonitor",
    "MFUMonitor",
    "MemoryMonitor",
    "IdleTimeMonitor",
    "RolloutMetrics",
    "RolloutProgressBar",
    "ValidateAtStart",
    "ThunderSyncWandbLogger",
    "default_wandb_logger",
    "default_callbacks",
    "PeakFlops",
    "PEAK_FLOPS_TABLE",
    "resolve_peak_flops",
    "read_timeline",
    "draw_timeline",
]


def default_callbacks() -> list[Callback]:
    """One of each monitor with default settings (the progress bar is left to the Trainer/config)."""
    return [StalenessMonitor(), MFUMonitor(), MemoryMonitor(), IdleTimeMonitor(), RolloutMetrics()]
