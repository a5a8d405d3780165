"""The learner's side of a bucketed vLLM publish ("ipc", "nccl"): the workers receive on the
engine's step loop while the publishing thread sends (:mod:`..weights.transport`, :mod:`.worker`).

The first publish, and the first after a failed one, forms the transfer group (the workers join
through ``collective_rpc("thundersync_join")`` while this side connects). A failure on either
side fails the publish on both (the protocol keeps them in lockstep) and drops the group, so the
next publish starts from a fresh one whatever state the failure left. The learner's own error is
the one raised; the workers' is chained.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

import torch
from torch import Tensor

from ...core.errors import EngineError
from ..weights.transport import Transport, WeightSender

__all__ = ["StreamedPublish"]

T = TypeVar("T")
CallLLM = Callable[[Callable[[Any], Any]], Any]  # run fn(llm) on the step loop, return its result


class StreamedPublish:
    """Bucketed publishes into one engine's workers;
    ``call`` runs a function of the ``LLM`` on its step loop."""

    def __init__(
        self, transport: Transport, workers: int, timeout_s: float, bucket_bytes: int, call: CallLLM
    ) -> None:
        self.transport = transport
        self._workers = workers
        self._timeout_s = timeout_s
        self._bucket_bytes = bucket_bytes
        self._call = call
        self._sender: WeightSender | None = None

    def publish(self, weights: Mapping[str, Tensor]) -> None:
        """Load ``weights`` into every worker; raises if any side failed (the model may then mix versions)."""
        try:
            if self._sender is None:
                self._sender = self._join()
            sender = self._sender
            info = sender.prepare(weights, self._bucket_bytes)
            wire = pickle.dumps(info)  # vLLM's RPC would turn a dataclass into a dict
            received = _in_thread(
                lambda: self._call(lambda llm: llm.collective_rpc("thundersync_receive", args=(wire,)))
            )
            sent: BaseException | None = None
            try:
                sender.send(weights, info)
            except BaseException as exc:  # the workers stop at the same bucket: wait for them first
                sent = exc
            try:
                counts = received.result(timeout=self._timeout_s)
            except BaseException:
                if sent is None:
                    raise
                raise EngineError(f"{type(sent).__name__}: {sent} (the workers stopped there too)") from sent
            if sent is not None:
                raise sent
            if any(c != len(weights) for c in counts):
                raise EngineError(f"the workers loaded {list(counts)} tensors of {len(weights)}")
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    def _join(self) -> WeightSender:
        sender = WeightSender(
            self.transport,
            receivers=self._workers,
            device_type="cuda" if torch.cuda.is_available() else "cpu",
            timeout_s=self._timeout_s,
        )
        wire = pickle.dumps(sender.join_info)
        joined = _in_thread(
            lambda: self._call(lambda llm: llm.collective_rpc("thundersync_join", args=(wire,)))
        )
        connected = _in_thread(sender.connect)
        try:
            joined.result(timeout=self._timeout_s)  # a worker that cannot join fails here first
            connected.result(timeout=self._timeout_s)
        except BaseException:
            sender.close()
            raise
        return sender


def _in_thread(fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` on a daemon thread now; its result or exception lands in the future."""
    future: Future[T] = Future()

    def run() -> None:
        try:
            future.set_result(fn())
        except BaseException as exc:
            future.set_exception(exc)

    threading.Thread(target=run, name="vllm-weight-sync", daemon=True).start()
    return future
