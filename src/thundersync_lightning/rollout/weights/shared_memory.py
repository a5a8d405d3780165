"""Moving a state dict to another process through shared memory, one buffer per dtype.

``SharedWeights.pack(weights)`` copies the (detached, CPU) tensors into one flat shared-memory
tensor per dtype; the object pickles through a ``torch.multiprocessing`` queue as file
descriptors, so the receiver maps the same pages without a copy. Each publish packs a fresh
buffer: the sender may overwrite its own parameters right after ``pack`` returns, and a receiver
still generating with an older snapshot is never affected.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from math import prod

import torch
from torch import Tensor

__all__ = ["SharedWeights"]


@dataclass(frozen=True)
class SharedWeights:
    """A picklable snapshot: flat shared buffers plus (name, dtype, offset, shape) per tensor."""

    buffers: dict[str, Tensor]
    layout: tuple[tuple[str, str, int, tuple[int, ...]], ...]

    @staticmethod
    def pack(weights: Mapping[str, Tensor]) -> SharedWeights:
        sizes: dict[str, int] = {}
        layout: list[tuple[str, str, int, tuple[int, ...]]] = []
        for name, tensor in weights.items():
            key = str(tensor.dtype).removeprefix("torch.")
            offset = sizes.get(key, 0)
            layout.append((name, key, offset, tuple(tensor.shape)))
            sizes[key] = offset + tensor.numel()
        buffers = {key: torch.empty(n, dtype=getattr(torch, key)).share_memory_() for key, n in sizes.items()}
        with torch.no_grad():
            for (_, key, offset, shape), tensor in zip(layout, weights.values()):
                n = prod(shape)
                buffers[key][offset : offset + n].copy_(tensor.detach().reshape(-1))
        return SharedWeights(buffers, tuple(layout))

    def unpack(self) -> dict[str, Tensor]:
        """Views into the shared buffers, by name (no copy)."""
        return {
            name: self.buffers[key][offset : offset + prod(shape)].view(shape)
            for name, key, offset, shape in self.layout
        }

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers.values())
