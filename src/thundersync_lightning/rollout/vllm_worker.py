"""vLLM worker extension: in-place weight reload, reached through ``collective_rpc``.

vLLM mixes this class into every worker it starts (``worker_extension_cls``); the engine then
calls its methods by name on all workers at once. Both methods feed Hugging Face ``state_dict``
names to ``Worker.reload_weights``, which runs the model's own ``load_weights`` (fusing q/k/v and
gate/up, skipping a tied ``lm_head``) and copies into the existing parameters: no restart, no new
KV cache. The caller must reset the prefix cache afterwards (cached KV blocks hold activations of
the old weights).

A third method, :meth:`WeightSyncExtension.thundersync_scale_logits`, tempers a teacher engine's
logits (see :mod:`.vllm_teacher`).

Two transports:

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

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["WeightSyncExtension", "WORKER_EXTENSION", "save_weights_file"]

WORKER_EXTENSION = f"{__name__}.WeightSyncExtension"


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

    def _thundersync_reload(self, weights: Mapping[str, torch.Tensor]) -> None:
        worker: Any = self
        with torch.no_grad():
            worker.reload_weights(weights_iterator=iter(weights.items()))


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
