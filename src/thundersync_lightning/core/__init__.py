"""Pure-torch core: exact streaming GRPO, the policy snapshot, rollout types and protocols.

This package never imports Lightning.
"""

from .accumulator.report import GroupStat, StreamingReport
from .accumulator.streaming import StreamingGRPO
from .errors import *  # noqa: F403
from .errors import __all__ as _errors_all
from .gradients.backward import BackwardBackend, ForwardWatch, PlainBackward
from .gradients.deferred import DeferredGradient
from .gradients.storage import ByteUsage, Offload
from .grpo.estimators import (
    EstimatorName,
    advantages,
    available_estimators,
    get_estimator,
    register_estimator,
)
from .grpo.objective import PRESETS, BatchTotals, Objective
from .grpo.terms import (
    OnPolicyStats,
    TokenScores,
    TrajectoryTerms,
    engine_logprobs,
    reference_loss,
    teacher_logprobs,
    trajectory_terms,
)
from .protocols import (
    EngineFactory,
    EngineFootprint,
    EngineSampling,
    Environment,
    PreparesAhead,
    RolloutEngine,
    TaskSource,
)
from .snapshot import PolicySnapshot
from .types import (
    ContentReady,
    GroupRequest,
    ModelSpec,
    RewardReady,
    RolloutEvent,
    RolloutRequest,
    Segment,
    StepResult,
    Trajectory,
    derive_seed,
    group_id,
    trajectory_id,
)

__all__ = [
    "Objective",
    "BatchTotals",
    "PRESETS",
    "TokenScores",
    "TrajectoryTerms",
    "OnPolicyStats",
    "engine_logprobs",
    "teacher_logprobs",
    "trajectory_terms",
    "reference_loss",
    "StreamingGRPO",
    "StreamingReport",
    "BackwardBackend",
    "PlainBackward",
    "ForwardWatch",
    "DeferredGradient",
    "GroupStat",
    "PolicySnapshot",
    "ByteUsage",
    "Offload",
    "EstimatorName",
    "advantages",
    "available_estimators",
    "get_estimator",
    "register_estimator",
    "Environment",
    "RolloutEngine",
    "PreparesAhead",
    "TaskSource",
    "EngineFactory",
    "EngineSampling",
    "EngineFootprint",
    "ContentReady",
    "GroupRequest",
    "ModelSpec",
    "RewardReady",
    "RolloutEvent",
    "RolloutRequest",
    "Segment",
    "StepResult",
    "Trajectory",
    "derive_seed",
    "group_id",
    "trajectory_id",
    *_errors_all,
]
