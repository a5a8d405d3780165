"""A thread pool for environment calls that never raises and never hangs its caller.

Every call (``reset``, ``step``, ``verdict``) runs in a worker thread and resolves to an
:class:`Outcome`: either the value, or a failure reason (the exception, or "timed out after
T s"). A call that overruns its timeout is resolved as a failure by a watchdog thread at its
deadline; the stuck thread itself cannot be killed (Python threads cannot be interrupted), so it
keeps its pool slot until it returns, and its late result is discarded.

Invariants:
- every submitted call resolves exactly once (value, exception or timeout);
- a free worker takes the queued call of the lowest ``priority`` (then the oldest): work for the
  step being generated (priority 0) never waits behind work prepared ahead for the next step
  (``AgentLoop.prepare``, priority 1), however many prepared resets are queued;
- the timeout clock starts when the call starts running, not when it is queued, so a busy pool
  never turns queueing delay into spurious timeouts.

.. warning::
    A hung call holds a pool thread forever. Size ``workers`` for the number of calls that may
    hang at once plus the normal concurrency, or make environments enforce their own limits
    (sandboxes with a wall-clock kill).
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ...core.errors import HostFault

__all__ = ["Outcome", "EnvPool", "run_detached"]

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
        workers: number of threads (calls that merely wait, such as simulated latency or a
            sandbox subprocess, need a thread each while they wait).
        name: thread-name prefix, for debugging.
    """

    def __init__(self, workers: int, name: str = "env") -> None:
        if workers < 1:
            raise ValueError(f"EnvPool needs at least 1 worker, got {workers}")
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=name)
        self._deadlines: list[tuple[float, int, Future[Outcome[Any]], str]] = []
        self._counter = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._queue: list[tuple[int, int, Callable[[], None]]] = []  # (priority, seq, run): a heap
        self._queue_lock = threading.Lock()
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
                self._arm(future, time.monotonic() + timeout_s, f"{what} timed out after {timeout_s:g} s")
            try:
                result = Outcome(fn())
            except BaseException as exc:  # an environment must never take the pool down
                result = Outcome(None, f"{what} raised {_describe(exc)}", isinstance(exc, HostFault))
            _resolve(future, result)

        if self._closed:
            _resolve_now(future, Outcome(None, f"{what} not run: the environment pool is shut down"))
            return future
        with self._queue_lock:
            heapq.heappush(self._queue, (priority, next(self._counter), run))
        # one slot per queued call; the slot runs whichever queued call is best when a worker frees
        self._executor.submit(self._run_next)
        return future

    def _run_next(self) -> None:
        with self._queue_lock:
            _, _, run = heapq.heappop(self._queue)
        run()

    def shutdown(self) -> None:
        """Stop accepting calls; queued calls are dropped, running ones are not waited for."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._executor.shutdown(wait=False, cancel_futures=True)

    # -- watchdog ---------------------------------------------------------------------------

    def _arm(self, future: Future[Any], deadline: float, reason: str) -> None:
        with self._cond:
            heapq.heappush(self._deadlines, (deadline, next(self._counter), future, reason))
            self._cond.notify()

    def _watch(self) -> None:
        while True:
            expired: list[tuple[Future[Any], str]] = []
            with self._cond:
                if self._closed:
                    return
                now = time.monotonic()
                while self._deadlines and (self._deadlines[0][2].done() or self._deadlines[0][0] <= now):
                    _, _, future, reason = heapq.heappop(self._deadlines)
                    if not future.done():
                        expired.append((future, reason))
                if not expired:
                    wait = self._deadlines[0][0] - now if self._deadlines else None
                    self._cond.wait(timeout=wait)
            for future, reason in expired:  # resolve outside the lock: callbacks run here
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
