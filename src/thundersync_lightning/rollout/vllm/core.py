"""The policy's vLLM engine core inside a :class:`~.engine.VLLMEngine`: the step loop that owns
it, how a publish's weights reach it, and its restart when its process dies.

Restart (worker processes, up to ``max_engine_restarts`` times): a new engine core starts, the
weights of the latest completed load are loaded into it through the same transport ("ipc"/"nccl":
a fresh transfer group), and every generation call the dead core left unfinished runs again.
Exactness: a generation call is one turn of some episodes, and turn ``k`` of the trajectory with
seed ``s`` samples with seed ``turn_seed(s, k)`` from its own prefix (:mod:`..agent.loop`), so its
tokens are a function of (seed, prefix, weights) only. The invariant that makes the weights the
same: the core generates only with the weights of the latest completed load (the engine's
publish waits until no request is generating), so a restart that loads those weights again
reproduces the lost tokens exactly. They are kept as a CPU copy, because the learner steps its
parameters in place after publishing; ``max_engine_restarts=0`` keeps none. A core that dies
during a load is restarted with the weights being loaded.

Every caller that failed on the same dead core waits for one restart and then runs again; past
the budget, or if the new core cannot start or load, the core is marked dead and every call
raises :class:`EngineError` naming the death and ``max_engine_restarts``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from torch import Tensor

from ...core.errors import EngineError
from ..agent.loop import Generation, GenerationRequest
from .loop import StepLoop, core_processes
from .stream import StreamedPublish
from .worker import save_weights_file

if TYPE_CHECKING:  # annotations only
    from .config import VLLMEngineConfig

__all__ = ["RestartingCore"]

log = logging.getLogger(__name__)

Loop = StepLoop[GenerationRequest, Generation]


class RestartingCore:
    """The current engine core's step loop, replaced when its process dies; see the module docstring.

    Args:
        loop: the first step loop (its ``LLM`` already built).
        open_loop: builds a further one (a restart).
        weight_sync: the resolved transport ("direct", "file", "ipc" or "nccl").
        config: the engine's :class:`~.config.VLLMEngineConfig`.
        weights_path: a fresh path for a "file" load.
    """

    def __init__(
        self,
        loop: Loop,
        open_loop: Callable[[], Loop],
        weight_sync: str,
        config: VLLMEngineConfig,
        weights_path: Callable[[], str],
    ) -> None:
        self.loop = loop
        self._open_loop = open_loop
        self._weight_sync = weight_sync
        self._config = config
        self._weights_path = weights_path
        self._restartable = config.multiprocessing and config.max_engine_restarts > 0
        self._lock = threading.Lock()  # one restart at a time; shutdown waits for it
        self._closed = False
        self._snapshot: dict[str, Tensor] | None = None
        self._streams = self._open_streams()
        self.restart_count = 0
        self.dead: str | None = None  # why the core is gone for good (past the budget)

    @property
    def pids(self) -> tuple[int, ...]:
        """Process ids of the current engine core (empty in-process)."""
        return tuple(p.pid for p in core_processes(self.loop.llm) if p.pid is not None)

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """The agent loop's generation call; runs again on a restarted core if the core died meanwhile."""
        while True:
            loop = self.loop
            try:
                return loop.generate(requests)
            except BaseException as exc:
                if not self._died(loop):
                    raise
                self._restart(loop, None, exc)

    def load(self, weights: Mapping[str, Tensor], path: str | None = None) -> None:
        """Load ``weights`` (``path``: already written there, for "file"); keep a copy for a restart."""
        loop = self.loop
        try:
            self._transfer(weights, path)
        except BaseException as exc:
            if not self._died(loop):
                raise
            self._restart(loop, weights, exc)  # the new core gets these weights
        if self._restartable:  # a copy: the learner steps its parameters in place
            self._snapshot = {name: t.detach().to("cpu", copy=True) for name, t in weights.items()}

    def close(self) -> None:
        """Stop the engine core (waits for a restart in progress). Idempotent."""
        with self._lock:
            self._closed = True
            if self._streams is not None:
                self._streams.close()
            self.loop.close()

    # -- pieces ---------------------------------------------------------------------------------

    def _open_streams(self) -> StreamedPublish | None:
        """The bucketed transfer into the current loop's workers ("ipc"/"nccl"; a fresh group)."""
        if self._weight_sync not in ("ipc", "nccl"):
            return None
        c = self._config
        transport: Any = self._weight_sync
        return StreamedPublish(
            transport,
            c.tensor_parallel_size,
            c.transfer_timeout_s,
            c.weight_sync_bucket_bytes,
            self.loop.call,
        )

    def _transfer(self, weights: Mapping[str, Tensor], path: str | None = None) -> None:
        """Load ``weights`` into the current engine core through the configured transport."""
        if self._streams is not None:
            self._streams.publish(weights)
            self.loop.call(_reset_prefix_cache)
        elif self._weight_sync == "file":
            written = path is None
            path = path or self._weights_path()
            try:
                if written:
                    save_weights_file(weights, path)
                self.loop.call(lambda llm: _reload(llm, "thundersync_load_file", (path,)))
            finally:
                if written and os.path.exists(path):
                    os.remove(path)
        else:
            self.loop.call(lambda llm: _reload(llm, "thundersync_load_state", (dict(weights),)))

    def _died(self, loop: Loop) -> bool:
        """Whether ``loop``'s engine-core process has exited (what a restart can repair)."""
        if self._closed or not self._config.multiprocessing:
            return False
        return loop is not self.loop or any(not p.is_alive() for p in core_processes(loop.llm))

    def _restart(self, dead: Loop, weights: Mapping[str, Tensor] | None, cause: BaseException) -> None:
        """Replace ``dead``'s engine core and load ``weights`` (None: the latest load) into it."""
        with self._lock:
            if self.dead is not None:
                raise EngineError(self.dead) from cause
            if self._closed:
                raise EngineError("the engine was shut down") from cause
            if self.loop is not dead:  # another caller restarted it
                return
            budget = self._config.max_engine_restarts
            codes = ", ".join(f"pid {p.pid}, exit code {p.exitcode}" for p in core_processes(dead.llm))
            what = f"the vLLM engine core ({codes}) died"
            if self.restart_count >= budget:
                self.dead = (
                    f"{what} after {self.restart_count} restart(s) (max_engine_restarts={budget}). Check its "
                    "memory use (OOM kill); raise max_engine_restarts to survive more deaths."
                )
                raise EngineError(self.dead) from cause
            self.restart_count += 1
            log.warning("%s; restart %d of %d", what, self.restart_count, budget)
            if self._streams is not None:
                self._streams.close()
            dead.close()
            try:
                self.loop = self._open_loop()
                self._streams = self._open_streams()
                load = weights if weights is not None else self._snapshot
                if load is not None:
                    self._transfer(load)
            except BaseException as exc:
                self.dead = f"{what}; its restart failed: {type(exc).__name__}: {exc}"
                raise EngineError(self.dead) from exc


def _reset_prefix_cache(llm: Any) -> None:
    if not llm.reset_prefix_cache():
        raise EngineError("vLLM refused to reset its prefix cache after a weight reload")


def _reload(llm: Any, method: str, args: tuple[Any, ...]) -> None:
    llm.collective_rpc(method, args=args)
    _reset_prefix_cache(llm)
