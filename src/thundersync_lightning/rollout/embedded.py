"""The embedded engine: a frozen policy snapshot generating in its own process.

Learner side of the engine. The generation process (spawned, see :mod:`.embedded_worker`)
builds its own model from the :class:`ModelSpec`, with its own thread budget, and receives
weights by :meth:`EmbeddedEngine.publish` through shared memory. Usage::

    engine = EmbeddedEngineConfig(temperature=1.0).build(model_spec, tasks)
    engine.publish(model.state_dict(), version=0)
    for event in engine.rollout(request):      # ContentReady / RewardReady, completion order
        ...
    engine.publish(model.state_dict(), version=1)
    engine.shutdown()

Logprobs: each scored token carries ``log_softmax(logits / T)[token]`` in float32, under the
temperature-scaled distribution BEFORE top-p truncation (``config.temperature`` = T); a learner
that divides its logits by the same T gets the same numbers from its forward of the same weights
(tested to 1e-4 in float32).

Protocol guarantees (see :class:`~thundersync_lightning.core.protocols.RolloutEngine`):
requests are generated in the order issued, each with the weights published before it was
issued; every trajectory yields one ContentReady and one RewardReady; a dead process, a fatal
error in it or a start-up past ``startup_timeout_s`` raises :class:`EngineError` in the learner
within ``poll_interval_s`` of being noticed. The process is stopped by :meth:`shutdown`, by
garbage collection of the engine, or at interpreter exit.

Clock: event times are ``time.monotonic()`` of the generation process, which shares the host's
system-wide monotonic clock with the learner; ``submitted_at`` is the learner's issue time.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any

import torch.multiprocessing as mp
from torch import Tensor

from ..core.errors import EngineError
from ..core.protocols import TaskSource
from ..core.types import ModelSpec, RolloutEvent, RolloutRequest
from .config import EmbeddedEngineConfig
from .embedded_worker import worker_main
from .teacher import check_teacher
from .weights import SharedWeights

__all__ = ["EmbeddedEngine"]

log = logging.getLogger(__name__)


class EmbeddedEngine:
    """A :class:`~thundersync_lightning.core.protocols.RolloutEngine` with a separate generation process.

    Args:
        model_spec: the policy's architecture (weights arrive by :meth:`publish`).
        tasks: a picklable task source; the process builds environments from it.
        config: engine settings (defaults: CPU, 1 thread, T=1, top_p=1).
    """

    def __init__(
        self, model_spec: ModelSpec, tasks: TaskSource, config: EmbeddedEngineConfig | None = None
    ) -> None:
        self.config = config or EmbeddedEngineConfig()
        if self.config.teacher is not None:  # a wrong teacher fails here, before the process starts
            check_teacher(self.config.teacher, model_spec)
        ctx = mp.get_context("spawn")
        self._commands: Any = ctx.Queue()
        self._events: Any = ctx.Queue()
        self._process = ctx.Process(
            target=worker_main,
            args=(model_spec, tasks, self.config, self._commands, self._events),
            name="thundersync-embedded-engine",
            daemon=True,
        )
        self._lock = threading.RLock()
        self._streams: dict[int, _Stream] = {}
        self._next_request = 0
        self._version: int | None = None
        self._applied: int | None = None
        self._fatal: str | None = None
        self._closed = False
        try:
            self._process.start()
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise EngineError(
                f"cannot send the task source or ModelSpec to the generation process ({exc}); define "
                "task classes at module level (importable by name) and keep their fields picklable."
            ) from exc
        self._finalizer = weakref.finalize(self, _stop_process, self._process, self._commands, self._events)
        self._await_ready()

    # -- protocol -----------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """Last published version (-1 before the first publish)."""
        return -1 if self._version is None else self._version

    @property
    def applied_version(self) -> int | None:
        """Last version the process has loaded (lags :attr:`version` while it is busy)."""
        return self._applied

    @property
    def pid(self) -> int | None:
        """Process id of the generation process."""
        return self._process.pid

    def publish(self, weights: Mapping[str, Tensor], version: int) -> None:
        """Snapshot ``weights`` (HF ``state_dict`` names) as ``version`` for requests issued from now on.

        Copies the tensors into fresh shared memory and returns; the caller may modify its
        parameters immediately. Versions must increase.
        """
        self._check_usable()
        if self._version is not None and version <= self._version:
            raise EngineError(
                f"publish(version={version}) after version {self._version}: versions must increase, "
                "otherwise staleness (trained version - policy_version) is meaningless. Publish the "
                "optimizer step count after each step."
            )
        if not weights:
            raise EngineError("publish() got no tensors: pass the policy's full state_dict().")
        packed = SharedWeights.pack(weights)
        self._commands.put(("publish", int(version), packed))
        self._version = int(version)

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        """Queue ``request`` and return its event iterator at once (completion order, each event once)."""
        self._check_usable()
        if self._version is None:
            raise EngineError(
                "rollout() before any publish(): the engine has no weights. Call "
                "engine.publish(model.state_dict(), version=0) first."
            )
        with self._lock:
            request_id = self._next_request
            self._next_request += 1
            stream = _Stream(self, request_id, 2 * request.num_trajectories)
            self._streams[request_id] = stream
        self._commands.put(("rollout", request_id, request, time.monotonic()))
        return stream

    def shutdown(self) -> None:
        """Stop the generation process and its environment threads; idempotent."""
        self._closed = True
        self._finalizer()

    def __enter__(self) -> EmbeddedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # -- transport ----------------------------------------------------------------------------

    def _check_usable(self) -> None:
        if self._fatal is not None:
            raise EngineError(f"the generation process failed:\n{self._fatal}")
        if self._closed:
            raise EngineError("the engine was shut down; build a new one to keep generating.")

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while True:
            try:
                msg = self._events.get(timeout=self.config.poll_interval_s)
            except queue.Empty:
                if not self._process.is_alive():
                    self.shutdown()
                    raise EngineError(
                        f"the generation process exited during start-up (exit code {self._process.exitcode}); "
                        "check that the ModelSpec and the task source can be built and pickled, and that the "
                        "launching script runs its training under `if __name__ == \"__main__\":` (the process "
                        "is started with spawn, which re-imports the main module)."
                    ) from None
                if time.monotonic() > deadline:
                    self.shutdown()
                    raise EngineError(
                        f"the generation process was not ready after startup_timeout_s="
                        f"{self.config.startup_timeout_s:g} s; raise it if imports are slow on this machine."
                    ) from None
                continue
            if msg[0] == "ready":
                return
            if msg[0] == "fatal":
                self.shutdown()
                raise EngineError(f"the generation process failed during start-up:\n{msg[1]}")

    def _pump(self) -> None:
        """Receive one message (or time out), route it; raise EngineError if the process is gone."""
        with self._lock:
            self._check_usable()
            try:
                msg = self._events.get(timeout=self.config.poll_interval_s)
            except queue.Empty:
                if not self._process.is_alive():
                    self._fatal = f"the generation process died (exit code {self._process.exitcode})"
                    self.shutdown()
                    raise EngineError(
                        f"{self._fatal}; events still missing. Check its memory use (OOM kill) "
                        "and environment code that may crash the interpreter."
                    ) from None
                return
            kind = msg[0]
            if kind == "event":
                stream = self._streams.get(msg[1])
                if stream is not None:
                    stream._deliver(msg[2])
            elif kind == "applied":
                self._applied = msg[1]
            elif kind == "fatal":
                self._fatal = msg[1]
                self.shutdown()
                raise EngineError(f"the generation process failed:\n{msg[1]}")

    def _forget(self, request_id: int) -> None:
        with self._lock:
            self._streams.pop(request_id, None)


class _Stream(Iterator[RolloutEvent]):
    """The events of one request, filled by whichever iterator pumps the engine's queue."""

    def __init__(self, engine: EmbeddedEngine, request_id: int, expected: int) -> None:
        self._engine = engine
        self._request_id = request_id
        self._remaining = expected
        self._undelivered = expected
        self._buffer: deque[RolloutEvent] = deque()

    def _deliver(self, event: RolloutEvent) -> None:
        self._buffer.append(event)
        self._undelivered -= 1
        if self._undelivered == 0:
            self._engine._forget(self._request_id)

    def __next__(self) -> RolloutEvent:
        idle_limit = self._engine.config.idle_timeout_s
        waiting_since = time.monotonic()
        while not self._buffer:
            if self._remaining == 0:
                raise StopIteration
            self._engine._pump()
            if idle_limit is not None and not self._buffer and time.monotonic() - waiting_since > idle_limit:
                raise EngineError(
                    f"no event for request {self._request_id} in idle_timeout_s={idle_limit:g} s while the "
                    "process is alive; raise idle_timeout_s or the environment timeouts."
                )
        self._remaining -= 1
        return self._buffer.popleft()


def _stop_process(process: Any, commands: Any, events: Any) -> None:
    """Ask the process to exit, then terminate/kill it; close the queues. Safe to call twice."""
    try:
        if process.is_alive():
            try:
                commands.put(("shutdown",))
            except (ValueError, OSError):
                pass
            process.join(timeout=5.0)
        if process.is_alive():
            process.terminate()
            process.join(timeout=2.0)
        if process.is_alive():
            process.kill()
            process.join(timeout=2.0)
    except (ValueError, AssertionError):  # process never started or already closed
        pass
    for q in (commands, events):
        try:
            q.cancel_join_thread()
            q.close()
        except (ValueError, OSError):
            pass
