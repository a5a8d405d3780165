"""Verdicts of a task start only once no episode of that task acts, in any group or step.

Why: a verdict runs the hidden tests on the host, in sandboxes that share things with every acting
sandbox (the read-only ``/usr`` and its locks, the host's load). A grading run whose code under
test encodes what it reads (the hidden tests) in anything an acting episode can observe (``flock``
on a shared read-only file, ``inotify`` on ``/usr``, CPU load) would hand an episode of the same
task, in its own group, another group that drew the same task, or the next step's request, the
tests it is graded on. Episodes of other tasks gain nothing from them. Sharing nothing would mean
a private copy of everything a sandbox can read for every grading run; holding a verdict costs at
most the time until the episodes of its task in flight now stop acting (measured in
``benchmarks/verdict_gate.py``).

Invariant: a held verdict of key ``k`` is released only when the count of acting episodes of ``k``
is zero; an episode counts as acting from the moment its request is run until its last environment
call has returned and, for an episode that ended in a failure, its ``close`` (which kills the runs
still in flight) has returned too. The gate belongs to one agent loop (one engine process): episodes
of other engine processes (other data-parallel ranks) are not counted.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
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
    """Counts acting episodes per key (a task) and holds the key's verdicts until none acts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acting: dict[Hashable, int] = {}
        self._held: dict[Hashable, list[Callable[[], None]]] = {}

    def acting(self, key: Hashable) -> int:
        with self._lock:
            return self._acting.get(key, 0)

    def enter(self, key: Hashable) -> None:
        """One more episode of ``key`` acts."""
        with self._lock:
            self._acting[key] = self._acting.get(key, 0) + 1

    def hold(self, key: Hashable, start: Callable[[], None]) -> None:
        """Run ``start`` (a verdict's start) now if no episode of ``key`` acts, else when the last one stops."""
        with self._lock:
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
