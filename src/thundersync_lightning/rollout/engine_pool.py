"""Several rollout engines behind one: a step's groups spread over N engines, one event stream.

Notation: engines e_0 .. e_{N-1}; a request's groups in request order; ``c`` the pool's cursor
(how many groups it has placed so far, over every request).

- **Placement.** The j-th group of a request goes to engine ``(c + j) mod N`` (round robin that
  continues across requests): within a request the engines' group counts differ by at most one,
  and a rank with fewer groups than engines still uses every engine over consecutive requests.
  A group is never split: its G samples run on one engine (one snapshot, a shared prompt cache).
- **Exactness.** An engine receives a sub-request with the request's ``step`` and ``seed`` and
  each group's global ``group_index``; a trajectory's seed is ``derive_seed(seed, step,
  group_index, sample)`` (every turn is seeded from it), never the engine or batch that runs it.
  So the pool returns the trajectories and rewards one engine returns for the same request, and
  training with N engines equals training with one (up to float rounding of batched forwards,
  the same noise as a different completion order; tested through a fit).
- **Weights.** ``publish(weights, v)`` publishes to every engine, one thread each, and returns
  when all hold ``v``; each engine keeps its own ordering contract, so a request issued after
  the publish is generated with ``v`` on every engine and one issued before it with the old
  version. A publish that fails on some engine leaves the pool refusing to generate until a
  complete publish succeeds (engines that already hold that version are not published to again).
- **Events.** One thread per engine stream moves its events into one queue; the pool's iterator
  blocks on the queue, so events arrive in completion order over all engines without polling.
- **Faults.** Each engine handles its own deaths as it does alone (the embedded engine restarts
  its process and replays, up to ``max_engine_restarts``). An error that escapes an engine (past
  its restart budget, a vLLM crash, an idle timeout) is raised by the pool's iterator as
  :class:`EngineError` naming the engine; whatever that engine then refuses, the pool refuses.
  ``shutdown`` shuts every engine down (no process is left behind).

Cost: N copies of the generation model, and every publish copies the weights to each engine.

Example (LightningCLI)::

    engine:
      class_path: thundersync_lightning.rollout.EnginePoolConfig
      init_args:
        num_engines: 2
        engine:
          class_path: thundersync_lightning.rollout.EmbeddedEngineConfig
          init_args: {num_threads: 1, env_workers: 16}

On GPUs, ``per_engine`` places the engines (``[{device: "cuda:1"}, {device: "cuda:2"}]`` for
the embedded engine; ``[{engine_kwargs: {device_ids: [1]}}, ...]`` for vLLM, see docs/vllm.md).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import Tensor

from ..core.contract import check_engine
from ..core.errors import ConfigError, EngineError
from ..core.options import strict_options
from ..core.protocols import (
    EngineFactory,
    EngineFootprint,
    EngineSampling,
    PreparesAhead,
    RolloutEngine,
    TaskSource,
)
from ..core.types import ModelSpec, RolloutEvent, RolloutRequest

__all__ = ["EnginePoolConfig", "EnginePool", "place_groups"]

log = logging.getLogger(__name__)

#: Fields that decide what an engine samples: every member must share them (one source of truth).
_SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "dtype", "teacher")

T = TypeVar("T")


@strict_options
@dataclass(frozen=True, slots=True)
class EnginePoolConfig:
    """Settings of :class:`EnginePool` (LightningCLI/YAML-constructible; ``build`` starts it).

    Attributes:
        engine: the configuration every engine is built from (any engine config with
            ``build(model_spec, tasks)``: embedded, vLLM, trace replay, a pool's own member).
        num_engines: N, engines in the pool (each starts its own generation process or vLLM).
        per_engine: optional, one dict per engine of fields replaced in ``engine`` for that
            engine only: placement such as ``device`` or vLLM ``engine_kwargs`` (the whole field
            is replaced). Fields that decide the sampled distribution (temperature, top_p, top_k,
            seed, dtype, teacher) are refused: every engine must sample the same policy.

    The pool samples as ``engine`` does (its ``sampling``); its ``footprint`` is that of its
    members (:meth:`footprint`).
    """

    engine: EngineFactory
    num_engines: int = 2
    per_engine: list[dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        p: list[str] = check_engine(self.engine)  # the engine contract (core/contract.py)
        if self.num_engines < 1:
            p.append(f"num_engines={self.num_engines}: must be >= 1")
        exclusive = None if p else self.engine.footprint.exclusive_in_process
        if self.num_engines > 1 and exclusive is not None:
            p.append(f"{exclusive} for num_engines > 1")
        if self.per_engine is not None:
            if len(self.per_engine) != self.num_engines:
                p.append(
                    f"per_engine has {len(self.per_engine)} entries for num_engines={self.num_engines}: give "
                    "one dict (possibly empty) per engine"
                )
            for k, changes in enumerate(self.per_engine):
                fixed = sorted(set(changes) & set(_SAMPLING_FIELDS))
                if fixed:
                    p.append(
                        f"per_engine[{k}] sets {', '.join(fixed)}: every engine must sample the same "
                        "distribution; set it on engine instead"
                    )
                elif dataclasses.is_dataclass(self.engine):
                    try:
                        dataclasses.replace(self.engine, **changes)  # type: ignore[type-var]
                    except (ConfigError, TypeError, ValueError) as exc:
                        p.append(f"per_engine[{k}]: {exc}")
                else:
                    p.append(f"per_engine needs a dataclass engine config, got {type(self.engine).__name__}")
        if p:
            raise ConfigError("EnginePoolConfig is invalid:\n  - " + "\n  - ".join(p))

    def members(self) -> list[EngineFactory]:
        """The configuration of each engine: ``engine`` with that engine's ``per_engine`` fields."""
        if self.per_engine is None:
            return [self.engine] * self.num_engines
        return [dataclasses.replace(self.engine, **changes) for changes in self.per_engine]  # type: ignore[type-var]

    def build(self, model_spec: ModelSpec, tasks: TaskSource) -> EnginePool:
        """Start the N engines concurrently (blocks until all are ready); one failure stops the others."""
        members = self.members()
        built = _each(lambda cfg: cfg.build(model_spec, tasks), members)
        failed = [(k, r) for k, r in enumerate(built) if isinstance(r, BaseException)]
        if failed:
            for engine in built:
                if not isinstance(engine, BaseException):
                    engine.shutdown()
            k, exc = failed[0]
            raise EngineError(f"engine {k} of {self.num_engines} of the pool failed to start: {exc}") from exc
        return EnginePool(built)

    @property
    def sampling(self) -> EngineSampling:
        """``engine``'s: per_engine may not change what is sampled."""
        return self.engine.sampling

    @property
    def footprint(self) -> EngineFootprint:
        """The members' footprints together: without ``per_engine`` the N engines share one placement
        (N times one engine's share of the learner's GPU, buckets included); with it they are placed
        apart and engine 0's share is planned on the learner's GPU (place the others off it). An
        episode is bounded by the loosest member."""
        members = [m.footprint for m in self.members()]
        limits = [f.max_context_tokens for f in members]
        shared = members if self.per_engine is None else members[:1]
        return dataclasses.replace(
            members[0],
            max_context_tokens=None if None in limits else max(limits),  # type: ignore[type-var]
            device_fraction=sum(f.device_fraction for f in shared),
            device_bytes=sum(f.device_bytes for f in shared),
            policy_copies=sum(f.policy_copies for f in shared),
            weight_sync_buckets=sum(f.weight_sync_buckets for f in shared),
        )


def place_groups(num_groups: int, num_engines: int, cursor: int = 0) -> list[int]:
    """Engine of each of ``num_groups`` groups: ``(cursor + j) mod num_engines`` (see module docstring)."""
    return [(cursor + j) % num_engines for j in range(num_groups)]


class EnginePool:
    """A :class:`~thundersync_lightning.core.protocols.RolloutEngine` over N
    engines; see the module docstring.

    Args:
        engines: started engines (``EnginePoolConfig.build`` starts them); the pool owns them and
            shuts them down with itself.
    """

    def __init__(self, engines: Sequence[RolloutEngine]) -> None:
        if not engines:
            raise ConfigError("EnginePool needs at least one engine")
        self._engines = tuple(engines)
        self._lock = threading.Lock()  # orders rollout issue against publish and shutdown
        self._version = -1
        self._incomplete: str | None = None
        self._cursor = 0
        self._closed = False

    @property
    def engines(self) -> tuple[RolloutEngine, ...]:
        """The member engines, in placement order."""
        return self._engines

    @property
    def version(self) -> int:
        """Last version every engine holds (-1 before the first complete publish)."""
        return self._version

    def publish(self, weights: Mapping[str, Tensor], version: int) -> None:
        """Publish ``weights`` as ``version`` to every engine (concurrently); raise if any refuses."""
        with self._lock:
            self._check_open()
            stale = [e for e in self._engines if e.version != version]
            results = _each(lambda engine: engine.publish(weights, version), stale)
            failed = [
                (self._engines.index(e), r) for e, r in zip(stale, results) if isinstance(r, BaseException)
            ]
            if failed:
                k, exc = failed[0]
                self._incomplete = (
                    f"the publish of version {version} failed on engine {k} of {len(self._engines)} ({exc}), "
                    "so the engines hold different weights"
                )
                raise EngineError(f"{self._incomplete}. Publish a complete state_dict again.") from exc
            self._version = int(version)
            self._incomplete = None

    def prepare(self, request: RolloutRequest) -> None:
        """Hand each engine that can prepare ahead the groups the NEXT ``rollout`` would place on it.

        The placement is the one the cursor gives now: exact when ``request`` is the next request
        rolled out (the strategy prepares the step after the one it issued last). Otherwise an
        engine prepares groups it will not run, which costs it time, never correctness.
        """
        with self._lock:
            self._check_open()
            placement = place_groups(len(request.groups), len(self._engines), self._cursor)
            for k, engine in enumerate(self._engines):
                groups = tuple(g for g, e in zip(request.groups, placement) if e == k)
                if groups and isinstance(engine, PreparesAhead):
                    engine.prepare(RolloutRequest(step=request.step, groups=groups, seed=request.seed))

    def rollout(self, request: RolloutRequest) -> Iterator[RolloutEvent]:
        """Spread ``request``'s groups over the engines and return one iterator over all their events."""
        with self._lock:
            self._check_open()
            if self._incomplete is not None:
                raise EngineError(
                    f"refusing to generate: {self._incomplete}. Publish a complete state_dict first."
                )
            n = len(self._engines)
            placement = place_groups(len(request.groups), n, self._cursor)
            self._cursor = (self._cursor + len(request.groups)) % n
            parts: list[tuple[int, Iterator[RolloutEvent]]] = []
            for k, engine in enumerate(self._engines):
                groups = tuple(g for g, e in zip(request.groups, placement) if e == k)
                if groups:
                    sub = RolloutRequest(step=request.step, groups=groups, seed=request.seed)
                    try:
                        parts.append((k, engine.rollout(sub)))
                    except EngineError as exc:
                        raise EngineError(f"engine {k} of {n} refused step {request.step}: {exc}") from exc
        return _PoolStream(parts, n, 2 * request.num_trajectories, request.step)

    def shutdown(self) -> None:
        """Shut every engine down (each leaves no process behind); idempotent."""
        with self._lock:
            self._closed = True
        errors = []
        for engine in self._engines:
            try:
                engine.shutdown()
            except Exception as exc:  # every engine must get its shutdown
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> EnginePool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError("the engine pool was shut down; build a new one to keep generating.")


@dataclass(frozen=True, slots=True)
class _Ended:
    engine: int
    error: BaseException | None = None


class _PoolStream(Iterator[RolloutEvent]):
    """The merged events of one request: a thread per engine stream feeds one queue."""

    def __init__(
        self, parts: list[tuple[int, Iterator[RolloutEvent]]], num_engines: int, expected: int, step: int
    ):
        self._queue: queue.SimpleQueue[RolloutEvent | _Ended] = queue.SimpleQueue()
        self._running = len(parts)
        self._remaining = expected
        self._num_engines = num_engines
        self._step = step
        for k, events in parts:
            threading.Thread(
                target=_drain,
                args=(k, events, self._queue),
                name=f"thundersync-pool-{step}-e{k}",
                daemon=True,
            ).start()

    def __next__(self) -> RolloutEvent:
        while self._running:
            item = self._queue.get()
            if not isinstance(item, _Ended):
                self._remaining -= 1
                return item
            self._running -= 1
            if item.error is not None:
                self._running = 0
                raise EngineError(
                    f"engine {item.engine} of {self._num_engines} failed during "
                    f"step {self._step}: {item.error}"
                ) from item.error
        if self._remaining != 0:  # each engine's stream ended (in order, after its events)
            raise EngineError(
                f"the engines' streams of step {self._step} ended {self._remaining} events short: an engine "
                "broke the RolloutEngine contract (every ContentReady and RewardReady exactly once)"
            )
        raise StopIteration


def _drain(engine: int, events: Iterator[RolloutEvent], out: queue.SimpleQueue[Any]) -> None:
    try:
        for event in events:
            out.put(event)
    except BaseException as exc:  # the consumer raises it; this thread only reports
        out.put(_Ended(engine, exc))
    else:
        out.put(_Ended(engine))


def _each(fn: Callable[[T], Any], items: Sequence[T]) -> list[Any]:
    """``fn(item)`` for every item, concurrently (one thread each); results or raised exceptions, in order."""
    results: list[Any] = [None] * len(items)

    def run(k: int) -> None:
        try:
            results[k] = fn(items[k])
        except BaseException as exc:
            results[k] = exc

    if len(items) == 1:
        run(0)
        return results
    threads = [
        threading.Thread(target=run, args=(k,), name=f"thundersync-pool-call-{k}") for k in range(len(items))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results
