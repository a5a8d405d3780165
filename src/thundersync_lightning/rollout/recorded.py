"""Record a step's rollouts once, replay them to any number of learners.

``RecordingEngines(factory)`` is an engine factory: the engine it builds is the factory's own,
with every event of every request kept, per step, in the order the learner received it.
``RecordedEngines(recording)`` builds an engine that answers the same requests with the same
events (same tokens, engine logprobs, rewards, versions and completion order) without generating,
each delivered as long after the request as it was recorded (the event times shifted by as much),
so a streaming learner sees the live run's interleaving of content and verdicts. Learners fed by
the recording and by its replay train on identical trajectories: any difference between their
gradients is the learners' own (``thundersync-lightning verify``).

Invariant: a replayed request must be one that was recorded (same step, same groups); any other
raises :class:`~thundersync_lightning.core.errors.EngineError` rather than inventing rollouts.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import Tensor

from ..core.errors import EngineError
from ..core.protocols import EngineFootprint, EngineSampling, RolloutEngine
from ..core.types import ContentReady, RolloutEvent, RolloutRequest
from .replay import _Schedule

__all__ = ["RecordingEngines", "RecordedEngines", "Recording"]

#: What identifies a request: its step and its groups' ids, in order.
_Key = tuple[int, tuple[str, ...]]


def _key(request: RolloutRequest) -> _Key:
    return request.step, tuple(g.group_id for g in request.groups)


def _shifted(event: RolloutEvent, by: float) -> RolloutEvent:
    """``event`` with every time in it moved by ``by`` seconds."""
    if isinstance(event, ContentReady):
        t = event.trajectory
        moved = dataclasses.replace(
            t, submitted_at=t.submitted_at + by, content_ready_at=t.content_ready_at + by
        )
        return ContentReady(moved, event.time + by)
    return dataclasses.replace(event, time=event.time + by)


class Recording:
    """Events per request with their delivery time, in seconds after the request was made.

    ``engine``: the engine config whose engines were recorded (``None``: unknown); a replay declares
    its sampling and footprint.
    """

    def __init__(self, engine: Any = None) -> None:
        self.engine = engine
        self._events: dict[_Key, tuple[float, list[tuple[float, RolloutEvent]]]] = {}

    def add(
        self, request: RolloutRequest, requested_at: float, events: list[tuple[float, RolloutEvent]]
    ) -> None:
        self._events[_key(request)] = (requested_at, events)

    def replay(
        self, request: RolloutRequest, clock: Callable[[], float] = time.monotonic
    ) -> Iterator[RolloutEvent]:
        """The recorded events of ``request``, each due as long after now as it was recorded."""
        requested_at, events = self._lookup(request)
        now = clock()
        by = now - requested_at
        timed = [(now + after, i, _shifted(event, by)) for i, (after, event) in enumerate(events)]
        return _Schedule(timed, clock)

    def _lookup(self, request: RolloutRequest) -> tuple[float, list[tuple[float, RolloutEvent]]]:
        key = _key(request)
        if key not in self._events:
            recorded = ", ".join(f"step {s} ({len(g)} groups)" for s, g in self._events) or "nothing"
            raise EngineError(
                f"replay of step {request.step} ({len(request.groups)} groups): that request was not "
                f"recorded (recorded: {recorded}); replay the same steps and groups as the recording."
            )
        return self._events[key]

    @property
    def num_events(self) -> int:
        return sum(len(events) for _, events in self._events.values())


class _RecordingEngine:
    """The wrapped engine, keeping each request's events as they pass to the learner."""

    def __init__(self, engine: RolloutEngine, recording: Recording) -> None:
        self._engine = engine
        self._recording = recording

    @property
    def version(self) -> int:
        return self._engine.version

    def publish(self, weights: Mapping[str, Tensor], version: int) -> None:
        self._engine.publish(weights, version)

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        requested_at = time.monotonic()
        kept: list[tuple[float, RolloutEvent]] = []
        self._recording.add(request, requested_at, kept)
        for event in self._engine.rollout(request):
            kept.append((time.monotonic() - requested_at, event))
            yield event

    def shutdown(self) -> None:
        self._engine.shutdown()


class _RecordedEngine:
    """Replays a recording: publish only records the version; rollout yields the recorded events."""

    def __init__(self, recording: Recording) -> None:
        self._recording = recording
        self._version = -1

    @property
    def version(self) -> int:
        return self._version

    def publish(self, weights: Mapping[str, Tensor], version: int) -> None:
        self._version = int(version)

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        return self._recording.replay(request)

    def shutdown(self) -> None:
        pass


class RecordingEngines:
    """An engine factory: ``factory``'s engines, recording into :attr:`recording`."""

    def __init__(self, factory: Any) -> None:
        self._factory = factory
        self.recording = Recording(factory)

    @property
    def sampling(self) -> EngineSampling:
        """The factory's: its engines generate."""
        return self._factory.sampling

    @property
    def footprint(self) -> EngineFootprint:
        return self._factory.footprint

    def build(self, model_spec: Any, tasks: Any) -> RolloutEngine:
        return _RecordingEngine(self._factory.build(model_spec, tasks), self.recording)


class RecordedEngines:
    """An engine factory whose engines replay ``recording`` (no model, no environment runs)."""

    def __init__(self, recording: Recording) -> None:
        self._recording = recording

    @property
    def sampling(self) -> EngineSampling:
        """The recorded engine's: the events carry its tokens and logprobs (the defaults if unknown)."""
        engine = self._recording.engine
        return EngineSampling() if engine is None else engine.sampling

    @property
    def footprint(self) -> EngineFootprint:
        """Nothing generates; episodes keep the recorded engine's bound."""
        engine = self._recording.engine
        return EngineFootprint(
            max_context_tokens=None if engine is None else engine.footprint.max_context_tokens
        )

    def build(self, model_spec: Any, tasks: Any) -> RolloutEngine:
        return _RecordedEngine(self._recording)
