"""Rollouts: engines that turn requests into streams of events, the agent loop, trace replay.

Public surface: the core rollout types (re-exported), the engine configs and engines, and the
pieces another engine reuses (:class:`AgentLoop`, :class:`EnvPool`, :data:`GenerateFn`).
"""

from ..core.protocols import Environment, RolloutEngine, TaskSource
from ..core.types import (
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
from .agent_loop import AgentLoop, GenerateFn, Generation, GenerationRequest, check_verdict
from .config import EmbeddedEngineConfig, TraceReplayEngineConfig
from .embedded import EmbeddedEngine
from .env_pool import EnvPool, Outcome
from .hf_generator import HFGenerator
from .models import build_model
from .pool import EnginePool, EnginePoolConfig, place_groups
from .replay import TraceReplayEngine, load_trace, sync_idle_fraction
from .requests import make_request
from .sampling import sample_from_logprobs, temperature_logprobs, turn_seed
from .teacher import TeacherConfig, TeacherScorer, load_teacher
from .vllm_config import VLLMEngineConfig
from .vllm_server_config import VLLMServerEngineConfig

__all__ = [
    # core types
    "Trajectory",
    "Segment",
    "ContentReady",
    "RewardReady",
    "RolloutEvent",
    "RolloutRequest",
    "GroupRequest",
    "StepResult",
    "ModelSpec",
    "derive_seed",
    "group_id",
    "trajectory_id",
    "RolloutEngine",
    "Environment",
    "TaskSource",
    # engines
    "EmbeddedEngineConfig",
    "VLLMEngineConfig",
    "VLLMServerEngineConfig",
    "EmbeddedEngine",
    "TeacherConfig",
    "TeacherScorer",
    "load_teacher",
    "TraceReplayEngineConfig",
    "TraceReplayEngine",
    "load_trace",
    "sync_idle_fraction",
    "EnginePoolConfig",
    "EnginePool",
    "place_groups",
    # building blocks
    "AgentLoop",
    "GenerateFn",
    "Generation",
    "GenerationRequest",
    "check_verdict",
    "EnvPool",
    "Outcome",
    "HFGenerator",
    "build_model",
    "make_request",
    "sample_from_logprobs",
    "temperature_logprobs",
    "turn_seed",
]
