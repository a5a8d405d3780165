"""A task's verdicts and its acting episodes never overlap, in any group or step of this loop.

Why: a verdict runs the hidden tests on the host, in sandboxes that share things with every acting
sandbox (the read-only ``/usr`` and its locks, its page cache, the host's load). A grading run whose
code under test encodes what it reads (the hidden tests) in anything an acting episode can observe
(``flock`` on a shared read-only file, ``inotify`` on ``/usr``, which pages of ``/usr`` are cached,
CPU load) would hand an episode of the same task, in its own group, another group that drew the
same task, or the next step's request, the tests it is graded on. Episodes of other tasks gain
nothing from them. Sharing nothing would mean a private copy of everything a sandbox can read for
every grading run; holding costs at most the time until the episodes of the task in flight stop
acting, or its verdicts running now end (measured in ``benchmarks/verdict_gate.py``).

Two directions, per key ``k`` (a task):

- a verdict of ``k`` starts only when no episode of ``k`` acts (:meth:`VerdictGate.hold`; it is
  released by the last :meth:`~VerdictGate.stop`);
- an episode of ``k`` starts acting only when no verdict of ``k`` is held or running
  (:meth:`VerdictGate.admit`; it is admitted by the last :meth:`~VerdictGate.finished`). With
  ahead-of-time or asynchronous issuing, a next step's episode would otherwise act while this
  step's verdict of its task runs. Waiting episodes do not count as acting, and a held verdict
  makes new episodes wait: neither side waits on the other in a cycle, and a stream of new
  episodes cannot starve a held verdict.

Invariant: for every key, (acting episodes > 0) and (running verdicts > 0) are never both true. An
episode acts from its admission until its last environment call has returned and, for an episode
that ended in a failure, its ``close`` (which kills the runs still in flight) has returned too (its
reset, which runs no model output, may run before its admission). A verdict counts from
:meth:`~VerdictGate.hold` until its run and its environment's close have returned. The gate
belongs to one agent loop (one engine process): episodes and verdicts of other engine processes
(other data-parallel ranks) are not counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

__all__ = ["VerdictGate", "task_key"]


def task_key(task: Any) -> Hashable:
    """What identifies a task for the gate: its ``repr`` (equal tasks drawn twice share it; a task
    whose repr collides with another's only gates more). A task without a repr: its identity."""
    try:
        return ("repr", repr(task))
    except Exception:  # noqa: BLE001 - a hostile __repr__ must not take the loop down
        return ("id", id(task))


class VerdictGate:
    """Per key (a task): counts acting episodes and pending verdicts (held or running), holds a
    key's verdicts while an episode of it acts and its new episodes while a verdict of it is pending."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acting: dict[Hashable, int] = {}
        self._verdicts: dict[Hashable, int] = {}  # held or running, until finished()
        self._held: dict[Hashable, list[Callable[[], None]]] = {}
        self._waiting: dict[Hashable, list[Future[None]]] = {}

    def acting(self, key: Hashable) -> int:
        with self._lock:
            return self._acting.get(key, 0)

    def pending_verdicts(self, key: Hashable) -> int:
        with self._lock:
            return self._verdicts.get(key, 0)

    def enter(self, key: Hashable) -> None:
        """One more episode of ``key`` acts, now (whatever verdicts are pending: see :meth:`admit`)."""
        with self._lock:
            self._acting[key] = self._acting.get(key, 0) + 1

    def admit(self, key: Hashable) -> Future[None]:
        """A future done once an episode of ``key`` may act (at once when no verdict of ``key`` is
        pending): from then it counts as acting, until :meth:`stop`."""
        admitted: Future[None] = Future()
        with self._lock:
            if self._verdicts.get(key, 0) == 0:
                self._acting[key] = self._acting.get(key, 0) + 1
                admitted.set_result(None)
            else:
                self._waiting.setdefault(key, []).append(admitted)
        return admitted

    def withdraw(self, key: Hashable, admitted: Future[None]) -> bool:
        """The episode of ``admitted`` will not act after all: True when it had been admitted already
        (then it acts until :meth:`stop`), False when it was still waiting (now forgotten)."""
        with self._lock:
            waiting = self._waiting.get(key, [])
            if admitted in waiting:
                waiting.remove(admitted)
                if not waiting:
                    del self._waiting[key]
                return False
        return True

    def hold(self, key: Hashable, start: Callable[[], None]) -> None:
        """Count a verdict of ``key`` as pending and run ``start`` (its start) now if no episode of
        ``key`` acts, else when the last one stops. The caller reports its end with :meth:`finished`."""
        with self._lock:
            self._verdicts[key] = self._verdicts.get(key, 0) + 1
            if self._acting.get(key, 0) > 0:
                self._held.setdefault(key, []).append(start)
                return
        start()

    def stop(self, key: Hashable) -> None:
        """One episode of ``key`` stopped acting; the last one releases every held verdict of ``key``
        (in the order held)."""
        with self._lock:
            count = self._acting.get(key, 0)
            if count <= 0:
                raise RuntimeError("VerdictGate.stop called more often than episodes entered")
            if count == 1:
                del self._acting[key]
                released = self._held.pop(key, [])
            else:
                self._acting[key] = count - 1
                released = []
        for start in released:
            start()

    def finished(self, key: Hashable) -> None:
        """A verdict of ``key`` ended (its run and its environment's close returned); the last
        pending one admits every waiting episode of ``key``."""
        with self._lock:
            count = self._verdicts.get(key, 0)
            if count <= 0:
                raise RuntimeError("VerdictGate.finished called more often than verdicts held")
            if count == 1:
                del self._verdicts[key]
                admitted = self._waiting.pop(key, [])
                if admitted:
                    self._acting[key] = self._acting.get(key, 0) + len(admitted)
            else:
                self._verdicts[key] = count - 1
                admitted = []
        for future in admitted:
            future.set_result(None)
