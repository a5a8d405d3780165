"""Lightning glue: ``ThunderSyncStrategy`` and the typed per-step statistics it records."""

from .stats import AccumulatorBytes, Interval, RolloutProgress, StepStats, TrajectoryRecord
from .strategy import Mode, ThunderSyncStrategy

__all__ = [
    "ThunderSyncStrategy",
    "Mode",
    "StepStats",
    "TrajectoryRecord",
    "Interval",
    "AccumulatorBytes",
    "RolloutProgress",
]
