"""The embedded engine: a frozen policy snapshot generating in its own process.

Learner side of the engine. The generation process (forked from a fork server or spawned, see
:mod:`.process`) builds its own model from the :class:`ModelSpec`, with its own thread
budget, and receives weights by :meth:`EmbeddedEngine.publish` through shared memory. Usage::

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
issued; every trajectory yields one ContentReady and one RewardReady, exactly once. A fatal error
in the process or a start-up past ``startup_timeout_s`` raises :class:`EngineError`. The process
is stopped by :meth:`shutdown`, by garbage collection of the engine, or at interpreter exit, and
dies with the learner if the learner is killed (:mod:`.lifeline`).

Process death (killed, OOM): noticed at once (end-of-file on the event pipe). Up to
``config.max_engine_restarts`` times per engine the process is restarted and every request not
yet complete is replayed exactly: the snapshot each was issued with is published again (frozen
versions: kept in shared memory while a request or the latest publish needs them), then the
request's unfinished groups are generated again. Trajectory seeds depend only on (seed, step,
group, sample), so the replayed trajectories are the lost ones, token for token; events already
delivered are not delivered twice, and a replayed trajectory whose tokens differ from the
delivered one (an environment that is not deterministic given its seed) fails its request with
:class:`EngineError` rather than pairing a reward with other tokens. Past the budget, or if the
restarted process cannot start, the waiting iterator raises :class:`EngineError`. Cost of the
guarantee: the learner keeps up to two weight snapshots (shared memory) while requests run; set
``max_engine_restarts=0`` to keep none.

Preparing ahead (:class:`~thundersync_lightning.core.protocols.PreparesAhead`): ``prepare(request)``
sends the request to the process, whose command thread starts its environments (``make_env``,
``reset``: the prompt tokens) in the environment pool at once, even while another request
generates; the later ``rollout`` of the request uses them. Environments prepared but never rolled
out are closed when the process shuts down. A restarted process is sent the latest request
prepared and not yet rolled out again (what the dead one had prepared is lost with it).

Clock: event times are ``time.monotonic()`` of the generation process, which shares the host's
system-wide monotonic clock with the learner; ``submitted_at`` is the learner's issue time.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from torch import Tensor

from ...core.errors import EngineError
from ...core.protocols import TaskSource
from ...core.types import ContentReady, ModelSpec, RolloutEvent, RolloutRequest
from ..teacher import check_teacher
from ..weights.shared_memory import SharedWeights
from .process import GenerationProcess, ProcessGone

if TYPE_CHECKING:  # annotations only: the config builds this engine
    from ..config import EmbeddedEngineConfig

__all__ = ["EmbeddedEngine"]

log = logging.getLogger(__name__)


class _Holder:
    """The current generation process; the engine's finalizer stops whatever it holds."""

    def __init__(self, process: GenerationProcess) -> None:
        self.process = process

    def stop(self) -> None:
        self.process.stop()


class EmbeddedEngine:
    """A :class:`~thundersync_lightning.core.protocols.RolloutEngine` with a separate generation process.

    Args:
        model_spec: the policy's architecture (weights arrive by :meth:`publish`).
        tasks: a picklable task source; the process builds environments from it.
        config: engine settings (defaults: CPU, 1 thread, T=1, top_p=1).
    """

    def __init__(self, model_spec: ModelSpec, tasks: TaskSource, config: EmbeddedEngineConfig) -> None:
        self.config = config
        if self.config.teacher is not None:  # a wrong teacher fails here, before the process starts
            check_teacher(self.config.teacher, model_spec)
        self._model_spec = model_spec
        self._tasks = tasks
        self._lock = threading.RLock()  # held while receiving (one pumping iterator at a time)
        self._send_lock = threading.RLock()  # the current process, the streams, the snapshots
        self._streams: dict[int, _Stream] = {}
        self._snapshots: dict[int, SharedWeights] = {}
        self._next_request = 0
        self._version: int | None = None
        self._applied: int | None = None
        self._fatal: str | None = None
        self._closed = False
        self._restarts = 0
        self._prepared: RolloutRequest | None = None  # the latest prepared request not rolled out yet
        self._holder = _Holder(GenerationProcess(model_spec, tasks, self.config))
        self._finalizer = weakref.finalize(self, _Holder.stop, self._holder)
        try:
            self._holder.process.await_ready(self.config.startup_timeout_s, self.config.poll_interval_s)
        except EngineError:
            self.shutdown()
            raise

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
        """Process id of the current generation process (changes when it is restarted)."""
        return self._holder.process.pid

    @property
    def restart_count(self) -> int:
        """How many times the generation process was restarted after dying."""
        return self._restarts

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
        with self._send_lock:
            self._holder.process.send_publish(int(version), packed)
            self._version = int(version)
            if self.config.max_engine_restarts > 0:
                self._snapshots[self._version] = packed
                self._prune_snapshots()

    def prepare(self, request: RolloutRequest) -> None:
        """Start ``request``'s environments in the generation process now; return at once.

        Needs no weights (a prepare before the first publish is fine) and generates nothing; the
        events of the later ``rollout(request)`` are the same as without it.
        """
        self._check_usable()
        with self._send_lock:
            self._holder.process.send(("prepare", request))
            self._prepared = request

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        """Queue ``request`` and return its event iterator at once (completion order, each event once)."""
        self._check_usable()
        if self._version is None:
            raise EngineError(
                "rollout() before any publish(): the engine has no weights. Call "
                "engine.publish(model.state_dict(), version=0) first."
            )
        issued_at = time.monotonic()
        with self._send_lock:
            request_id = self._next_request
            self._next_request += 1
            stream = _Stream(self, request_id, request, self._version, issued_at)
            self._streams[request_id] = stream
            self._holder.process.send(("rollout", request_id, request, issued_at))
            if self._prepared is not None and self._prepared.step <= request.step:
                self._prepared = None
        return stream

    def shutdown(self) -> None:
        """Stop the generation process and its environment threads; idempotent."""
        self._closed = True
        self._finalizer()
        self._snapshots.clear()

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

    def _fail(self, reason: str) -> EngineError:
        self._fatal = reason
        self.shutdown()
        return EngineError(reason)

    def _pump(self) -> None:
        """Receive one message (or time out) and route it; restart a dead process or raise EngineError."""
        with self._lock:
            self._check_usable()
            try:
                msg = self._holder.process.receive(self.config.poll_interval_s)
            except ProcessGone:
                self._recover()
                return
            if msg is None:
                return
            kind = msg[0]
            if kind == "event":
                stream = self._streams.get(msg[1])
                if stream is not None:
                    stream._deliver(msg[2])
            elif kind == "applied":
                self._applied = msg[1]
                self._holder.process.applied(msg[1])
            elif kind == "fatal":
                raise self._fail(f"the generation process failed:\n{msg[1]}")

    def _recover(self) -> None:
        """The process died: restart it and replay every incomplete request, or raise EngineError."""
        with self._send_lock:
            self._check_usable()  # shut down meanwhile (from another thread): no restart after shutdown
            dead = self._holder.process
            exitcode = dead.exitcode
            dead.stop()
            what = f"the generation process (pid {dead.pid}) died (exit code {exitcode})"
            budget = self.config.max_engine_restarts
            if self._restarts >= budget:
                raise self._fail(
                    f"{what} with {len(self._streams)} request(s) unfinished, after {self._restarts} "
                    f"restart(s) (max_engine_restarts={budget}). Check its memory use (OOM kill) and "
                    "environment code that may crash the interpreter; raise max_engine_restarts to "
                    "survive more deaths."
                )
            self._restarts += 1
            log.warning(
                "%s; restart %d of %d, replaying %d request(s)",
                what,
                self._restarts,
                budget,
                len(self._streams),
            )
            try:
                process = GenerationProcess(self._model_spec, self._tasks, self.config)
            except EngineError as exc:
                raise self._fail(f"{what}; its restart failed: {exc}") from exc
            self._holder.process = process
            self._applied = None
            try:
                process.await_ready(self.config.startup_timeout_s, self.config.poll_interval_s)
            except EngineError as exc:
                raise self._fail(f"{what}; its restart failed: {exc}") from exc
            if self._prepared is not None:  # the dead process's prepared environments are lost
                process.send(("prepare", self._prepared))
            loaded: int | None = None
            for request_id, stream in self._streams.items():
                if stream.version != loaded:
                    process.send_publish(stream.version, self._snapshots[stream.version])
                    loaded = stream.version
                process.send(("rollout", request_id, stream.unfinished(), stream.issued_at))
            if self._version is not None and loaded != self._version:
                process.send_publish(self._version, self._snapshots[self._version])

    def _prune_snapshots(self) -> None:
        """Keep the snapshots a replay may need: the latest, and those of unfinished requests."""
        with self._send_lock:
            needed = {self._version} | {s.version for s in self._streams.values()}
            for version in [v for v in self._snapshots if v not in needed]:
                del self._snapshots[version]

    def _forget(self, request_id: int) -> None:
        with self._send_lock:
            self._streams.pop(request_id, None)
            self._prune_snapshots()


class _Stream(Iterator[RolloutEvent]):
    """The events of one request, filled by whichever iterator pumps the engine's pipe.

    Delivers each trajectory's ContentReady and RewardReady once; after a replay, events already
    delivered are dropped (a replayed content must carry the same tokens as the delivered one).
    """

    def __init__(
        self, engine: EmbeddedEngine, request_id: int, request: RolloutRequest, version: int, issued_at: float
    ) -> None:
        self._engine = engine
        self._request_id = request_id
        self.request = request
        self.version = version
        self.issued_at = issued_at
        self._remaining = 2 * request.num_trajectories
        self._undelivered = self._remaining
        self._buffer: deque[RolloutEvent] = deque()
        self._tokens: dict[str, tuple[int, ...]] = {}
        self._rewarded: set[str] = set()
        self._error: EngineError | None = None

    def unfinished(self) -> RolloutRequest:
        """The request restricted to the groups with a trajectory whose reward is not delivered."""
        ids = self.request.trajectory_ids()
        groups = tuple(
            g for g in self.request.groups if any(t not in self._rewarded for t in ids[g.group_id])
        )
        return RolloutRequest(step=self.request.step, groups=groups, seed=self.request.seed)

    def _deliver(self, event: RolloutEvent) -> None:
        if isinstance(event, ContentReady):
            traj = event.trajectory
            seen = self._tokens.get(traj.trajectory_id)
            if seen is not None:
                if seen != traj.tokens and self._error is None:
                    self._error = EngineError(
                        f"trajectory {traj.trajectory_id} came out different when replayed after the "
                        "generation process died (its environment is not deterministic given the "
                        "trajectory seed), so its reward cannot be paired with the delivered tokens; "
                        "this request cannot complete exactly."
                    )
                return
            self._tokens[traj.trajectory_id] = traj.tokens
        else:
            if event.trajectory_id in self._rewarded:
                return
            self._rewarded.add(event.trajectory_id)
        self._buffer.append(event)
        self._undelivered -= 1
        if self._undelivered == 0:
            self._engine._forget(self._request_id)

    def __next__(self) -> RolloutEvent:
        idle_limit = self._engine.config.idle_limit_s(int(getattr(self._engine._tasks, "max_turns", 1)))
        waiting_since = time.monotonic()
        while not self._buffer:
            if self._error is not None:
                self._engine._forget(self._request_id)
                raise self._error
            if self._remaining == 0:
                raise StopIteration
            self._engine._pump()
            if idle_limit is not None and not self._buffer and time.monotonic() - waiting_since > idle_limit:
                raise EngineError(
                    f"no event for request {self._request_id} in {idle_limit:g} s (idle_timeout_s="
                    f"{self._engine.config.idle_timeout_s!r}) while the process is alive: an environment or "
                    "generation is stuck; raise idle_timeout_s or lower the environment timeouts."
                )
        self._remaining -= 1
        return self._buffer.popleft()
