"""One thread that owns a vLLM ``LLM`` and drives its step loop (continuous batching).

Every caller hands work to this thread through a FIFO of commands and waits on a future:

- ``generate(requests)``: each request becomes one vLLM request (``make_request`` gives its token
  ids and ``SamplingParams``; for the policy ``n=1`` with its own seed, for a teacher a prompt-
  logprob scoring request); they join whatever is already running (continuous batching across
  callers) and the future resolves, with ``read(output)`` of each, when the last of them finishes;
- ``call(fn)``: run ``fn(llm)`` on this thread once no request is in flight, before any command
  queued after it (weight reloads, prefix-cache resets).

The thread blocks on the command queue when idle and calls ``LLMEngine.step()`` while requests
run; nothing polls or sleeps. If the engine raises, every pending and later future fails with
:class:`EngineError` (the engine is dead; build a new one). An engine core in its own process
that exits unexpectedly would leave ``step()`` waiting for outputs forever (vLLM's client stops
its output thread without waking the reader): a watcher thread blocked on the processes'
sentinels wakes it with an :class:`EngineError` naming the exit code.

Engines in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) share process-global state (the
forward context, the current vLLM config), so their loops take one ``step_lock`` around every
build, step, call and close: two in-process engines (a policy and its teacher) run one forward at a time.
Every engine of the process also shares vLLM's process groups: :func:`open_llm` and
:func:`close_llm` count the live engines, and only the last one to close drops the groups.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from ...core.errors import EngineError
from ..agent.loop import Generation

__all__ = ["IN_PROCESS_LOCK", "StepLoop", "close_llm", "core_processes", "open_llm", "read_generation"]

log = logging.getLogger(__name__)
T = TypeVar("T")
Req = TypeVar("Req")
Res = TypeVar("Res")


def read_generation(out: Any) -> Generation:
    """The sampled tokens of a finished ``n=1`` request and the logprob of each."""
    completion = out.outputs[0]
    tokens = tuple(int(t) for t in completion.token_ids)
    if completion.logprobs is None or len(completion.logprobs) != len(tokens):
        raise EngineError(
            f"vLLM returned {len(tokens)} tokens without one logprob each; the engine must be "
            "built with logprobs=0 sampling params"
        )
    return Generation(tokens, tuple(float(completion.logprobs[k][t].logprob) for k, t in enumerate(tokens)))


@dataclass(slots=True)
class _Batch:
    future: Future[list[Any]]
    results: list[Any]
    remaining: int = field(init=False)

    def __post_init__(self) -> None:
        self.remaining = len(self.results)


class StepLoop(Generic[Req, Res]):
    """Owns the ``LLM`` built by ``make_llm`` on a daemon thread; see the module docstring.

    Args:
        make_llm: builds the ``vllm.LLM`` (runs on the loop thread; its errors surface here).
        make_request: ``request -> (prompt token ids, vllm.SamplingParams)``.
        read: a finished ``vllm.RequestOutput`` -> the caller's result (an error kills the loop).
        on_close: called on the loop thread with the ``LLM`` when the loop stops (shutdown).
        step_lock: held around every build, step, call and close (in-process engines; None: no lock).
    """

    def __init__(
        self,
        make_llm: Callable[[], Any],
        make_request: Callable[[Req], tuple[Sequence[int], Any]],
        read: Callable[[Any], Res],
        on_close: Callable[[Any], None],
        name: str = "vllm-step-loop",
        step_lock: AbstractContextManager[Any] | None = None,
    ) -> None:
        self._make_llm = make_llm
        self._make_request = make_request
        self._read = read
        self._on_close = on_close
        self._lock: AbstractContextManager[Any] = step_lock if step_lock is not None else nullcontext()
        self._commands: queue.SimpleQueue[tuple[str, Any, Future[Any]]] = queue.SimpleQueue()
        self._ready: Future[Any] = Future()
        self._dead: BaseException | None = None
        self._closing = False
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.llm = self._ready.result()  # raises the build error, if any

    # -- caller side ------------------------------------------------------------------------

    def generate(self, requests: Sequence[Req]) -> list[Res]:
        """Run every request; blocks until all are done, results in request order (thread-safe)."""
        if not requests:
            return []
        return self._submit("generate", list(requests)).result()

    def call(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(llm)`` on the loop thread once nothing is in flight; returns its result."""
        return self._submit("call", fn).result()

    @property
    def stopped(self) -> bool:
        """Whether the loop has stopped (the engine raised, or :meth:`close`): every call fails."""
        return self._dead is not None

    def close(self) -> None:
        """Stop the loop (pending work fails), run ``on_close`` and join the thread."""
        self._closing = True
        if self._thread.is_alive():
            self._commands.put(("stop", None, Future()))
            self._thread.join()

    def _submit(self, kind: str, payload: Any) -> Future[Any]:
        future: Future[Any] = Future()
        if self._dead is not None:
            future.set_exception(self._dead_error())
            return future
        self._commands.put((kind, payload, future))
        return future

    def _dead_error(self) -> EngineError:
        return EngineError(
            f"the vLLM step loop has stopped ({self._dead!r}); shut this engine down and build a new one"
        )

    # -- loop thread ------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            with self._lock:
                llm = self._make_llm()
        except BaseException as exc:  # surface in the constructor's thread
            self._dead = exc
            self._ready.set_exception(
                EngineError(f"vLLM failed to start: {type(exc).__name__}: {exc}. See docs/vllm.md.")
            )
            return
        self._ready.set_result(llm)
        processes = core_processes(llm)
        if processes:
            threading.Thread(target=self._watch_core, args=(llm, processes),
                             name=f"{self._thread.name}-core-watch", daemon=True).start()  # fmt: skip
        engine = llm.llm_engine
        inflight: dict[str, tuple[_Batch, int]] = {}
        backlog: deque[tuple[str, Any, Future[Any]]] = deque()
        try:
            while True:
                busy = engine.has_unfinished_requests()
                if not backlog:
                    try:
                        backlog.append(self._commands.get(block=not busy))
                    except queue.Empty:
                        pass
                while True:  # drain without blocking
                    try:
                        backlog.append(self._commands.get_nowait())
                    except queue.Empty:
                        break
                if self._handle(engine, llm, backlog, inflight):
                    break
                if engine.has_unfinished_requests():
                    with self._lock:
                        outputs = engine.step()
                    self._finish(outputs, inflight)
        except BaseException as exc:
            self._dead = exc
            log.exception("vLLM step loop failed")
        finally:
            if self._dead is None:
                self._dead = EngineError("the engine was shut down")
            error = self._dead_error()
            for batch, _ in list(inflight.values()):
                if not batch.future.done():
                    batch.future.set_exception(error)
            while True:
                try:
                    backlog.append(self._commands.get_nowait())
                except queue.Empty:
                    break
            for _, _, future in backlog:
                if not future.done():
                    future.set_exception(error)
            try:
                with self._lock:
                    self._on_close(llm)
            except Exception:  # shutdown must not raise
                log.exception("vLLM engine shutdown failed")

    def _watch_core(self, llm: Any, processes: list[Any]) -> None:
        """Wake a ``step()`` waiting on an engine core that has exited (see the module docstring)."""
        from multiprocessing.connection import wait

        wait([p.sentinel for p in processes])  # returns once any of them has exited
        if self._closing or self._dead is not None:  # stopped by us, or already failed
            return
        codes = ", ".join(f"pid {p.pid} exit code {p.exitcode}" for p in processes if p.exitcode is not None)
        outputs = getattr(llm.llm_engine.engine_core, "outputs_queue", None)
        if outputs is not None:
            outputs.put_nowait(EngineError(f"the vLLM engine core exited ({codes})"))

    def _handle(self, engine: Any, llm: Any, backlog: deque[Any], inflight: dict[str, Any]) -> bool:
        """Start queued commands in order; returns True on stop. A ``call`` waits for idleness."""
        while backlog:
            kind, payload, future = backlog[0]
            if kind == "stop":
                return True
            if kind == "call":
                if engine.has_unfinished_requests():
                    return False  # keep stepping; later commands stay behind it
                backlog.popleft()
                try:
                    with self._lock:
                        result = payload(llm)
                    future.set_result(result)
                except BaseException as exc:
                    future.set_exception(exc)
                continue
            backlog.popleft()
            self._add(engine, payload, future, inflight)
        return False

    def _add(self, engine: Any, requests: list[Req], future: Future[Any], inflight: dict) -> None:
        from vllm.inputs import TokensPrompt

        batch = _Batch(future, [None] * len(requests))
        added: list[str] = []
        try:
            for index, req in enumerate(requests):
                rid = f"ts-{next(self._ids)}"
                prompt, params = self._make_request(req)
                engine.add_request(rid, TokensPrompt(prompt_token_ids=list(prompt)), params)
                inflight[rid] = (batch, index)
                added.append(rid)
        except Exception as exc:  # e.g. a prompt longer than max_model_len: fail this batch only
            for rid in added:
                inflight.pop(rid, None)
            if added:
                engine.abort_request(added)
            future.set_exception(EngineError(f"vLLM rejected a generation request: {exc}"))

    def _finish(self, outputs: Sequence[Any], inflight: dict[str, tuple[_Batch, int]]) -> None:
        for out in outputs:
            if not out.finished or out.request_id not in inflight:
                continue
            batch, index = inflight.pop(out.request_id)
            batch.results[index] = self._read(out)
            batch.remaining -= 1
            if batch.remaining == 0:
                batch.future.set_result(list(batch.results))


class _LiveEngines:
    """The vLLM engines this module has started in this process and not yet shut down.

    vLLM's process groups (and, for an in-process engine, torch.distributed's default group when
    vLLM created it) are shared by every engine in the process: only the last one to shut down
    may drop them.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._count = 0
        self._owns_torch_distributed = False

    def opening(self) -> None:
        import torch.distributed as dist

        with self._lock:
            if self._count == 0:
                self._owns_torch_distributed = not (dist.is_available() and dist.is_initialized())
            self._count += 1

    def closed(self) -> bool | None:
        """Count one engine down; None while others live,
        else whether vLLM created torch.distributed's group."""
        with self._lock:
            self._count -= 1
            return None if self._count > 0 else self._owns_torch_distributed


_LIVE = _LiveEngines()
IN_PROCESS_LOCK = threading.Lock()
"""The ``step_lock`` of every in-process engine: one build, forward, call or close at a time."""


def close_llm(llm: Any) -> None:
    """Stop the engine core; once the last engine of this process is stopped also drop vLLM's
    process groups, and the default torch.distributed group only if vLLM created it (never the
    learner's)."""
    llm.llm_engine.engine_core.shutdown()
    owns_torch_distributed = _LIVE.closed()
    if owns_torch_distributed is None:
        return
    import vllm.envs
    from vllm.distributed import parallel_state

    vllm.envs.disable_envs_cache()
    parallel_state.destroy_model_parallel()
    world = getattr(parallel_state, "_WORLD", None)
    if world is not None:
        world.destroy()
        parallel_state._WORLD = None
    import torch.distributed as dist

    if owns_torch_distributed and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def core_processes(llm: Any) -> list[Any]:
    """The ``multiprocessing`` processes of ``llm``'s engine core (empty for an in-process engine)."""
    resources = getattr(llm.llm_engine.engine_core, "resources", None)
    manager = getattr(resources, "engine_manager", None)
    return list(getattr(manager, "processes", None) or [])


def open_llm(make: Callable[[], T]) -> T:
    """``make()`` (builds a ``vllm.LLM``), counted among this process's live engines;
    stop it with :func:`close_llm`."""
    _LIVE.opening()
    try:
        return make()
    except BaseException:
        _LIVE.closed()
        raise
