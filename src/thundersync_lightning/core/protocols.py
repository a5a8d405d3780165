"""The two small protocols the rest of the package is written against.

A rollout engine turns a :class:`RolloutRequest` into a stream of events in completion order;
an environment is one task instance the agent acts in. A new task is a ``TaskSource`` (which
tasks a step uses, and how to build one) plus an ``Environment`` (reset, step, verdict).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from .types import RolloutEvent, RolloutRequest, StepResult

__all__ = [
    "RolloutEngine",
    "PreparesAhead",
    "EngineFactory",
    "EngineSampling",
    "EngineFootprint",
    "Environment",
    "TaskSource",
    "STEP_TIMEOUT_S",
    "VERDICT_TIMEOUT_S",
]

#: Every engine's default limit for one environment ``reset``/``step`` call, in seconds (one home:
#: the engine configs default to it, and task sources that warn about a long turn compare with it).
STEP_TIMEOUT_S = 60.0
#: Every engine's default limit for one verdict, in seconds.
VERDICT_TIMEOUT_S = 300.0


@runtime_checkable
class RolloutEngine(Protocol):
    """Produces trajectories with published weights, tagged with their version.

    Contract:
    - ``publish(weights, version)`` replaces the generation weights; it applies to every request
      issued after it and to none issued before it.
    - ``rollout(request)`` returns at once; iterating yields every ``ContentReady`` and
      ``RewardReady`` of the request exactly once, in completion order, then stops.
    - The same seed and weights give the same tokens and rewards whatever the completion order,
      batch composition or number of learner processes.
    - ``shutdown()`` is idempotent and leaves no process behind.
    """

    @property
    def version(self) -> int: ...

    def publish(self, weights: Mapping[str, Tensor], version: int) -> None: ...

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class PreparesAhead(Protocol):
    """An engine that can do a request's weight-independent work before its weights exist.

    Contract:
    - ``prepare(request)`` returns at once and generates nothing: it may create environments and
      sandboxes, prepare workspaces and tokenise prompts for ``request``, work that no policy
      weights enter, so doing it while the previous step trains leaves the staleness at 0.
    - A later ``rollout`` of the same request (same step and seed) uses what was prepared; a
      ``rollout`` without ``prepare`` is equally valid (it does the work itself), and the events are
      the same either way (only their times differ).
    """

    def prepare(self, request: RolloutRequest) -> None: ...


@runtime_checkable
class EngineFactory(Protocol):
    """An engine configuration: ``build(model_spec, tasks)`` starts the engine (a RolloutEngine).

    Annotated with ``Any`` on purpose: jsonargparse matches protocol implementations by exact
    annotations, and this is the type configs name engine classes under. Every engine config also
    declares ``sampling`` (an :class:`EngineSampling`) and ``footprint`` (an
    :class:`EngineFootprint`); they are checked at set-up with the rest of the extension contract
    (``core.contract.ENGINE_CONTRACT``), not here, because jsonargparse would match properties as
    methods.
    """

    def build(self, model_spec: Any, tasks: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class EngineSampling:
    """What an engine samples and reports: the distribution the learner must score.

    The update is the on-policy gradient only if the learner scores ``softmax(z / T)`` untruncated,
    as the engine sampled it (``strategy/objective_checks.py`` compares these with the policy).

    Attributes:
        temperature: T of the sampled distribution; ``None``: the engine samples from no model the
            learner scores (a trace replay), so there is nothing to compare.
        top_p: nucleus mass (1.0: no truncation).
        top_k: most likely tokens kept (0: no truncation).
        logprobs: the engine reports its sampling logprobs (importance correction needs them).
        teacher: a teacher scores every sampled token (on-policy distillation needs it).
    """

    temperature: float | None = 1.0
    top_p: float = 1.0
    top_k: int = 0
    logprobs: bool = True
    teacher: bool = False


@dataclass(frozen=True, slots=True)
class EngineFootprint:
    """What an engine takes of the learner's machine, as the memory plan reads it.

    Attributes:
        max_context_tokens: the engine's bound on one episode's tokens (prompt, actions and
            observations); ``None``: it sets none (the task source or the model's context does).
        on_learner_device: whether it runs on the learner's GPU when the learner has one (then a
            teacher it serves is planned there too).
        device_fraction: fraction of that GPU's memory it reserves for itself (0: none).
        device_bytes: bytes it holds there besides copies of the policy (a fixed-size KV cache).
        policy_copies: copies of the policy's weights it holds there.
        weight_sync_buckets: buckets of a bucketed publish held on the learner's GPU at once (0: the
            publish is not bucketed), ``weight_sync_bucket_bytes`` each.
        weight_sync_bucket_bytes: bytes per bucket.
        exclusive_in_process: the engine lives in the caller's process and a process holds at most
            one: why, and how to run several (``None``: any number can share a process).
    """

    max_context_tokens: int | None = None
    on_learner_device: bool = False
    device_fraction: float = 0.0
    device_bytes: int = 0
    policy_copies: int = 0
    weight_sync_buckets: int = 0
    weight_sync_bucket_bytes: int = 0
    exclusive_in_process: str | None = None


@runtime_checkable
class Environment(Protocol):
    """One task instance, at the level of token ids."""

    def reset(self) -> Sequence[int]: ...

    def step(self, action: Sequence[int]) -> StepResult: ...

    def verdict(self) -> float: ...

    def close(self) -> None: ...


@runtime_checkable
class TaskSource(Protocol):
    """Which tasks each step trains on, and how to instantiate one."""

    max_turns: int
    max_action_tokens: int
    stop_token: int | None

    def tasks(self, step: int, num_groups: int, seed: int) -> Sequence[Any]: ...

    def make_env(self, task: Any, seed: int) -> Environment: ...

    # Optional: ``max_episode_tokens() -> int``, an upper bound on one episode's tokens (prompt,
    # actions and observations). The memory plan sizes activations with it when the engine sets
    # no context limit (``max_context_tokens`` / ``max_model_len``).
