"""Verdicts of a group start only once every episode of the group has stopped acting.

Why: a verdict runs the hidden tests on the host, in sandboxes that share things with the acting
sandboxes of sibling episodes (the read-only ``/usr`` and its locks, the host's load). A grading
run whose code under test encodes what it reads (the hidden tests) in anything an acting sibling
can observe (``flock`` on a shared read-only file, ``inotify`` on ``/usr``, CPU load) would hand
the sibling, whose task is the same, the tests it is graded on. Sharing nothing would mean a
private copy of everything a sandbox can read; holding a group's verdicts costs at most one verdict's
latency per group (the group folds only when all its rewards are known anyway).

Invariant: a held verdict is released only when the gate's count of acting episodes is zero, and an
episode counts as acting until its last environment call has returned and, for an episode that
ended in a failure, its ``close`` (which kills the runs still in flight) has returned.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

__all__ = ["GroupGate"]


class GroupGate:
    """Counts the acting episodes of one group and holds the group's verdicts until none acts."""

    def __init__(self, acting: int) -> None:
        self._lock = threading.Lock()
        self._acting = acting
        self._held: list[Callable[[], None]] = []

    @property
    def acting(self) -> int:
        with self._lock:
            return self._acting

    def hold(self, start: Callable[[], None]) -> None:
        """Run ``start`` (a verdict's start) now if no episode acts, else when the last one stops."""
        with self._lock:
            if self._acting > 0:
                self._held.append(start)
                return
        start()

    def stop(self) -> None:
        """One episode stopped acting; the last one releases every held verdict (in the order held)."""
        with self._lock:
            if self._acting <= 0:
                raise RuntimeError("GroupGate.stop called more often than episodes were counted")
            self._acting -= 1
            released, self._held = (self._held, []) if self._acting == 0 else ([], self._held)
        for start in released:
            start()
