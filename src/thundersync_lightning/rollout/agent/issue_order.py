"""Rollouts ordered against publishes, for an engine whose episodes run in an :class:`AgentLoop`.

Contract (the :class:`~thundersync_lightning.core.protocols.RolloutEngine` one): a publish
applies to every request issued after it and to none issued before it. Here: a rollout is issued
under ``lock`` at the version current then, and counts as generating until its episodes are all
final; a publish takes ``lock`` (no rollout can be issued meanwhile) and :meth:`wait_idle` before
it loads anything, so the requests issued before it finish with the weights they were issued
with. Each rollout runs on a thread of its own and hands its events to the caller's iterator
through a queue, in completion order; no wait is unbounded (``event_timeout_s``).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ...core.errors import EngineError
from ...core.types import RolloutEvent, RolloutRequest

__all__ = ["IssueOrder"]

Run = Callable[..., None]
"""``run(request, version, emit, submitted_at=t)`` (:meth:`AgentLoop.run`): generate the request's
episodes, emitting each event."""


@dataclass(frozen=True, slots=True)
class _Crash:
    error: BaseException


class IssueOrder:
    """See the module docstring. ``owner`` names the engine's config in messages (the timeout's home);
    ``event_timeout_s`` None waits as long as the episodes may (their environment calls are unbounded)."""

    def __init__(self, run: Run, event_timeout_s: float | None, owner: str, thread_name: str) -> None:
        self.lock = threading.Lock()  # orders rollout issue against publish
        self._run = run
        self._timeout_s = event_timeout_s
        self._owner = owner
        self._thread_name = thread_name
        self._idle = threading.Condition()
        self._generating = 0  # rollouts whose episodes are not all final yet

    def rollout(self, request: RolloutRequest, issue: Callable[[], int]) -> Iterator[RolloutEvent]:
        """Issue ``request`` now at the version ``issue()`` returns (it raises if the engine cannot
        generate); the iterator yields its events in completion order."""
        submitted = time.monotonic()
        with self.lock:
            version = issue()
            events: queue.SimpleQueue[RolloutEvent | _Crash] = queue.SimpleQueue()
            with self._idle:
                self._generating += 1
            threading.Thread(
                target=self._serve,
                args=(request, version, events, submitted),
                name=f"{self._thread_name}-{request.step}",
                daemon=True,
            ).start()
        return self._events(events, 2 * request.num_trajectories, request.step)

    def wait_idle(self, version: int) -> None:
        """Block (holding ``lock``) until every issued rollout has finished generating; raises
        :class:`EngineError` after ``event_timeout_s``, before anything of ``version`` is loaded."""
        with self._idle:  # earlier requests finish with the weights they were issued with
            if not self._idle.wait_for(lambda: self._generating == 0, timeout=self._timeout_s):
                raise EngineError(
                    f"publish of version {version}: earlier requests still generating after "
                    f"event_timeout_s={self._timeout_s:g} s (the engine or an environment hangs); nothing "
                    "was loaded. Shut this engine down and build a new one."
                )

    def _serve(
        self, request: RolloutRequest, version: int, events: queue.SimpleQueue[Any], submitted: float
    ) -> None:
        try:
            self._run(request, version, events.put, submitted_at=submitted)
        except BaseException as exc:
            events.put(_Crash(exc))
        finally:
            with self._idle:
                self._generating -= 1
                self._idle.notify_all()

    def _events(self, events: queue.SimpleQueue[Any], expected: int, step: int) -> Iterator[RolloutEvent]:
        for seen in range(expected):
            try:
                item = events.get(timeout=self._timeout_s)
            except queue.Empty:
                raise EngineError(
                    f"no rollout event for {self._timeout_s:g} s in step {step} ({seen}/{expected} "
                    "received): an environment or the engine hangs. Fix it, or raise "
                    f"{self._owner}.event_timeout_s."
                ) from None
            if isinstance(item, _Crash):
                raise EngineError(f"the rollout of step {step} failed: {item.error}") from item.error
            yield item
