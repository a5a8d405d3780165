"""A thread pool for environment calls that never raises and never hangs its caller or the run.

Every call (``reset``, ``step``, ``verdict``) runs in a worker thread and resolves to an
:class:`Outcome`: either the value, or a failure reason (the exception, or "timed out after
T s"). A call that overruns its timeout is resolved as a failure by a watchdog thread at its
deadline, and logged. The stuck thread itself cannot be stopped (Python threads cannot be
interrupted; e.g. a tool handler the user wrote as a closure in their own process, which no
worker process can import, waiting forever), so the watchdog sets it aside and starts a new
thread in its slot: the pool always has ``workers`` threads taking calls, however many calls
hang. A set-aside thread ends when its call returns (its late result is discarded); one that
never returns is a daemon thread and does not keep the process alive.

Invariants:
- every submitted call resolves exactly once (value, exception, timeout, or "not run" after
  :meth:`EnvPool.shutdown`);
- ``workers`` threads take queued calls at all times until shutdown (a timed-out call's thread
  no longer counts);
- a free worker takes the queued call of the lowest ``priority`` (then the oldest): work for the
  step being generated (priority 0) never waits behind work prepared ahead for the next step
  (``AgentLoop.prepare``, priority 1), however many prepared resets are queued;
- the timeout clock starts when the call starts running, not when it is queued, so a busy pool
  never turns queueing delay into spurious timeouts.

.. warning::
    A call without a timeout (``timeout_s=None``) that hangs keeps its thread and its slot.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ...core.errors import HostFault

__all__ = ["Outcome", "EnvPool", "run_detached"]

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """The value of an environment call, or why there is none (``host_fault``: the call raised a
    :class:`~...core.errors.HostFault`, a fault no episode's action can have caused)."""

    value: T | None
    failure: str | None = None
    host_fault: bool = False

    @property
    def ok(self) -> bool:
        return self.failure is None


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class EnvPool:
    """Runs environment calls concurrently with per-call timeouts.

    Args:
        workers: number of threads taking calls (calls that merely wait, such as simulated
            latency or a sandbox subprocess, need a thread each while they wait).
        name: thread-name prefix, for debugging.
    """

    def __init__(self, workers: int, name: str = "env") -> None:
        if workers < 1:
            raise ValueError(f"EnvPool needs at least 1 worker, got {workers}")
        self.workers = workers
        self.name = name
        lock = threading.Lock()  # guards everything below; two conditions, so a notify reaches its kind
        self._ready = threading.Condition(lock)  # a call queued, or shut down: for the worker threads
        self._timer = threading.Condition(lock)  # a deadline armed, or shut down: for the watchdog
        self._queue: list[tuple[int, int, Callable[[], None], Future[Any], str]] = []  # a heap
        self._deadlines: list[tuple[float, int, Future[Outcome[Any]], str, int]] = []  # (..., thread ident)
        self._counter = itertools.count()
        self._set_aside: set[int] = set()  # threads whose call timed out: they end when it returns
        self.hung = 0  # calls that overran their timeout (their threads were set aside)
        self._closed = False
        for _ in range(workers):
            self._start_thread()
        self._watchdog = threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True)
        self._watchdog.start()

    def submit(
        self, fn: Callable[[], T], timeout_s: float | None, what: str = "call", priority: int = 0
    ) -> Future[Outcome[T]]:
        """Run ``fn()`` in the pool (lower ``priority`` first); the future always resolves to an
        :class:`Outcome`."""
        future: Future[Outcome[T]] = Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            if timeout_s is not None:
                self._arm(future, time.monotonic() + timeout_s, what, timeout_s)
            try:
                result = Outcome(fn())
            except BaseException as exc:  # an environment must never take the pool down
                result = Outcome(None, f"{what} raised {_describe(exc)}", isinstance(exc, HostFault))
            _resolve(future, result)

        with self._ready:
            if not self._closed:
                heapq.heappush(self._queue, (priority, next(self._counter), run, future, what))
                self._ready.notify()
                return future
        _resolve_now(future, Outcome(None, f"{what} not run: the environment pool is shut down"))
        return future

    def shutdown(self) -> None:
        """Stop accepting calls; queued calls resolve as not run, running ones are not waited for."""
        with self._ready:
            self._closed = True
            queued, self._queue = self._queue, []
            self._ready.notify_all()
            self._timer.notify_all()
        for _, _, _, future, what in queued:
            _resolve_now(future, Outcome(None, f"{what} not run: the environment pool is shut down"))

    # -- threads ----------------------------------------------------------------------------

    def _start_thread(self) -> None:
        threading.Thread(target=self._work, name=f"{self.name}-{next(self._counter)}", daemon=True).start()

    def _work(self) -> None:
        me = threading.get_ident()
        while True:
            with self._ready:
                while not self._queue and not self._closed:
                    self._ready.wait()
                if self._closed:
                    return
                run = heapq.heappop(self._queue)[2]
            run()
            with self._ready:
                if me in self._set_aside:  # its call timed out: a new thread has taken this slot
                    self._set_aside.discard(me)
                    return

    # -- watchdog ---------------------------------------------------------------------------

    def _arm(self, future: Future[Any], deadline: float, what: str, timeout_s: float) -> None:
        with self._timer:
            reason = f"{what} timed out after {timeout_s:g} s"
            heapq.heappush(
                self._deadlines, (deadline, next(self._counter), future, reason, threading.get_ident())
            )
            self._timer.notify()

    def _watch(self) -> None:
        while True:
            expired: list[tuple[Future[Any], str]] = []
            with self._timer:
                if self._closed:
                    return
                now = time.monotonic()
                while self._deadlines and (self._deadlines[0][2].done() or self._deadlines[0][0] <= now):
                    _, _, future, reason, thread = heapq.heappop(self._deadlines)
                    if not future.done():
                        expired.append((future, reason))
                        self._set_aside.add(thread)
                        self.hung += 1
                        self._start_thread()  # the slot goes on taking calls
                if not expired:
                    wait = self._deadlines[0][0] - now if self._deadlines else None
                    self._timer.wait(timeout=wait)
            for future, reason in expired:  # resolve outside the lock: callbacks run here
                log.warning(
                    "%s: %s; its thread cannot be stopped, so it is set aside and a new thread takes its "
                    "place in the pool (%d calls set aside so far)",
                    self.name,
                    reason,
                    self.hung,
                )
                _resolve(future, Outcome(None, reason))


def run_detached(fn: Callable[[], T], what: str = "call") -> Future[Outcome[T]]:
    """Run ``fn()`` now on a daemon thread of its own, outside any pool; the future resolves to an
    :class:`Outcome` as :meth:`EnvPool.submit`'s does (no timeout). For the close of a failed
    episode, which must not queue behind the calls that made it fail."""
    future: Future[Outcome[T]] = Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            result = Outcome(fn())
        except BaseException as exc:  # noqa: BLE001 - never raised into a thread that nobody joins
            result = Outcome(None, f"{what} raised {_describe(exc)}", isinstance(exc, HostFault))
        _resolve(future, result)

    threading.Thread(target=run, name=f"detached-{what}", daemon=True).start()
    return future


def _resolve(future: Future[Any], outcome: Outcome[Any]) -> None:
    """Set the result once; a second resolution (late result after a timeout) is dropped."""
    try:
        future.set_result(outcome)
    except InvalidStateError:
        pass


def _resolve_now(future: Future[Any], outcome: Outcome[Any]) -> None:
    future.set_running_or_notify_cancel()
    _resolve(future, outcome)
