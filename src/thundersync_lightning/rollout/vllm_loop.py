"""One thread that owns a vLLM ``LLM`` and drives its step loop (continuous batching).

Every caller hands work to this thread through a FIFO of commands and waits on a future:

- ``generate(requests)``: each request becomes one vLLM request (``n=1``, its own seed); they
  join whatever is already running (continuous batching across callers) and the future resolves
  when the last of them finishes;
- ``call(fn)``: run ``fn(llm)`` on this thread once no request is in flight, before any command
  queued after it (weight reloads, prefix-cache resets).

The thread blocks on the command queue when idle and calls ``LLMEngine.step()`` while requests
run; nothing polls or sleeps. If the engine raises, every pending and later future fails with
:class:`EngineError` (the engine is dead; build a new one).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..core.errors import EngineError
from .agent_loop import Generation, GenerationRequest

__all__ = ["StepLoop"]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(slots=True)
class _Batch:
    future: Future[list[Generation]]
    results: list[Generation | None]
    remaining: int = field(init=False)

    def __post_init__(self) -> None:
        self.remaining = len(self.results)


class StepLoop:
    """Owns the ``LLM`` built by ``make_llm`` on a daemon thread; see the module docstring.

    Args:
        make_llm: builds the ``vllm.LLM`` (runs on the loop thread; its errors surface here).
        make_params: ``GenerationRequest -> vllm.SamplingParams``.
        on_close: called on the loop thread with the ``LLM`` when the loop stops (shutdown).
    """

    def __init__(
        self,
        make_llm: Callable[[], Any],
        make_params: Callable[[GenerationRequest], Any],
        on_close: Callable[[Any], None],
        name: str = "vllm-step-loop",
    ) -> None:
        self._make_llm = make_llm
        self._make_params = make_params
        self._on_close = on_close
        self._commands: queue.SimpleQueue[tuple[str, Any, Future[Any]]] = queue.SimpleQueue()
        self._ready: Future[Any] = Future()
        self._dead: BaseException | None = None
        self._ids = itertools.count()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self.llm = self._ready.result()  # raises the build error, if any

    # -- caller side ------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Generation]:
        """Generate every request; blocks until all are done (thread-safe)."""
        if not requests:
            return []
        return self._submit("generate", list(requests)).result()

    def call(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(llm)`` on the loop thread once nothing is in flight; returns its result."""
        return self._submit("call", fn).result()

    def close(self) -> None:
        """Stop the loop (pending work fails), run ``on_close`` and join the thread."""
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
            llm = self._make_llm()
        except BaseException as exc:  # surface in the constructor's thread
            self._dead = exc
            self._ready.set_exception(
                EngineError(f"vLLM failed to start: {type(exc).__name__}: {exc}. See docs/vllm.md.")
            )
            return
        self._ready.set_result(llm)
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
                    self._step(engine, inflight)
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
                self._on_close(llm)
            except Exception:  # shutdown must not raise
                log.exception("vLLM engine shutdown failed")

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
                    future.set_result(payload(llm))
                except BaseException as exc:
                    future.set_exception(exc)
                continue
            backlog.popleft()
            self._add(engine, payload, future, inflight)
        return False

    def _add(
        self, engine: Any, requests: list[GenerationRequest], future: Future[Any], inflight: dict
    ) -> None:
        from vllm.inputs import TokensPrompt

        batch = _Batch(future, [None] * len(requests))
        added: list[str] = []
        try:
            for index, req in enumerate(requests):
                rid = f"ts-{next(self._ids)}"
                engine.add_request(
                    rid, TokensPrompt(prompt_token_ids=list(req.prefix)), self._make_params(req)
                )
                inflight[rid] = (batch, index)
                added.append(rid)
        except Exception as exc:  # e.g. a prompt longer than max_model_len: fail this batch only
            for rid in added:
                inflight.pop(rid, None)
            if added:
                engine.abort_request(added)
            future.set_exception(EngineError(f"vLLM rejected a generation request: {exc}"))

    def _step(self, engine: Any, inflight: dict[str, tuple[_Batch, int]]) -> None:
        for out in engine.step():
            if not out.finished or out.request_id not in inflight:
                continue
            batch, index = inflight.pop(out.request_id)
            completion = out.outputs[0]
            tokens = tuple(int(t) for t in completion.token_ids)
            if completion.logprobs is None or len(completion.logprobs) != len(tokens):
                raise EngineError(
                    f"vLLM returned {len(tokens)} tokens without one logprob each; the engine must be "
                    "built with logprobs=0 sampling params"
                )
            logprobs = tuple(float(completion.logprobs[k][t].logprob) for k, t in enumerate(tokens))
            batch.results[index] = Generation(tokens, logprobs)
            batch.remaining -= 1
            if batch.remaining == 0:
                batch.future.set_result([g for g in batch.results if g is not None])
