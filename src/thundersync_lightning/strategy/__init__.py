"""Lightning glue: ``ThunderSyncStrategy`` and the typed per-step statistics it records."""

from .plan import PlanLoader, RolloutPlan
from .stats import AccumulatorBytes, Interval, RolloutProgress, StepStats, TrajectoryRecord
from .strategy import Mode, ThunderSyncStrategy

__all__ = [
    "ThunderSyncStrategy",
    "Mode",
    "RolloutPlan",
    "PlanLoader",
    "StepStats",
    "TrajectoryRecord",
    "Interval",
    "AccumulatorBytes",
    "RolloutProgress",
]
