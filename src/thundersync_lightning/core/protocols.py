"""The two small protocols the rest of the package is written against.

A rollout engine turns a :class:`RolloutRequest` into a stream of events in completion order;
an environment is one task instance the agent acts in. A new task is a ``TaskSource`` (which
tasks a step uses, and how to build one) plus an ``Environment`` (reset, step, verdict).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from torch import Tensor

from .types import RolloutEvent, RolloutRequest, StepResult

__all__ = ["RolloutEngine", "PreparesAhead", "EngineFactory", "Environment", "TaskSource"]


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
    annotations, and this is the type configs name engine classes under.
    """

    def build(self, model_spec: Any, tasks: Any) -> Any: ...


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
