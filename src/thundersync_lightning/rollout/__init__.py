"""Rollouts: engines that turn requests into streams of events, the agent loop, trace replay.

Public surface: the engine configs and engines, and the pieces another engine reuses
(:class:`AgentLoop`, :class:`EnvPool`, :data:`GenerateFn`). The rollout types and protocols are the
core's (``thundersync_lightning.core``: ``Trajectory``, ``RolloutRequest``, ``RolloutEngine``, ...);
they are still importable from here, but exported once, by the core.
"""

from ..core.protocols import Environment, RolloutEngine, TaskSource  # noqa: F401 - the core's, importable here
from ..core.types import (  # noqa: F401 - the core's, importable here
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
from .agent.env_pool import EnvPool, Outcome
from .agent.loop import AgentLoop, GenerateFn, Generation, GenerationRequest, check_verdict
from .config import EmbeddedEngineConfig, TraceReplayEngineConfig
from .embedded.engine import EmbeddedEngine
from .embedded.generator import HFGenerator
from .engine_pool import EnginePool, EnginePoolConfig, place_groups
from .hf_model import build_model
from .replay import TraceReplayEngine, load_trace, sync_idle_fraction
from .requests import make_request
from .sampling import sample_from_logprobs, temperature_logprobs, turn_seed
from .teacher import TeacherConfig, TeacherScorer, load_teacher
from .vllm.config import VLLMEngineConfig
from .vllm.server_config import VLLMServerEngineConfig

__all__ = [
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
