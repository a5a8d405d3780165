"""Where the streaming accumulator keeps gradient buffers, and exact byte accounting.

``offload`` decides where per-group sums and held per-trajectory gradients live:

- ``"none"``: on the parameters' device (fastest; costs device memory),
- ``"cpu"``: pageable host memory,
- ``"pinned"``: page-locked host memory (asynchronous copies; needs an accelerator build of torch).

The step's folded gradient always stays on the parameters' device. Results are identical in every
mode: buffers hold the same dtype and are summed in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from .errors import ConfigError

__all__ = ["Offload", "ByteUsage", "GradientStore"]

Offload = Literal["none", "cpu", "pinned"]
_OFFLOADS = ("none", "cpu", "pinned")


@dataclass(frozen=True, slots=True)
class ByteUsage:
    """Bytes by where they live. On a CPU-only run the parameters' "device" is the host."""

    device: int = 0
    pinned_host: int = 0
    pageable_host: int = 0

    @property
    def total(self) -> int:
        return self.device + self.pinned_host + self.pageable_host


class GradientStore:
    """Allocates flat gradient buffers in one place and counts their bytes (current and peak).

    A flat buffer holds every trainable parameter's gradient concatenated in parameter order, in
    the accumulation dtype (float32, or float64 when any parameter is float64). Released buffers
    go to a free list and are reused (also across steps): a fresh large buffer costs first-touch
    page faults comparable to a sizeable fraction of a backward pass. Peak bytes in use therefore
    equal the bytes ever allocated.
    """

    def __init__(self, params: Sequence[torch.Tensor], offload: Offload = "none") -> None:
        if offload not in _OFFLOADS:
            raise ConfigError(f"offload={offload!r} is not one of {_OFFLOADS}")
        if offload == "pinned" and not torch.cuda.is_available():
            raise ConfigError(
                "offload='pinned' needs page-locked host memory, which this torch build "
                f"({torch.__version__}) cannot allocate without an accelerator; use offload='cpu' "
                "(pageable host memory, same results) or run on a CUDA build with a GPU."
            )
        self.offload: Offload = offload
        self.device = params[0].device
        self.dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        self.numel = sum(p.numel() for p in params)
        self._shapes = [p.shape for p in params]
        self._numels = [p.numel() for p in params]
        self._where = "device" if offload == "none" else ("pinned_host" if offload == "pinned" else "pageable_host")
        self._free: dict[str, list[torch.Tensor]] = {"device": [], "pinned_host": [], "pageable_host": []}
        self._staging: torch.Tensor | None = None
        self.reset_counters()

    def reset_counters(self) -> None:
        """A new step: nothing in use, peak restarts; the free lists are kept."""
        self._current = {"device": 0, "pinned_host": 0, "pageable_host": 0}
        self._peak = dict(self._current)
        self._leaf_bytes = 0

    def set_leaf_bytes(self, nbytes: int) -> None:
        """Device bytes held by boundary-cut leaf sums (counted with the buffers, current and peak)."""
        self._count("device", nbytes - self._leaf_bytes)
        self._leaf_bytes = nbytes

    @property
    def buffer_bytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    @property
    def on_device(self) -> bool:
        """True when sums live where the gradients are computed (no copy needed to add into them)."""
        return self.offload == "none"

    def _count(self, where: str, nbytes: int) -> None:
        self._current[where] += nbytes
        if nbytes > 0:
            self._peak[where] = max(self._peak[where], self._current[where])

    def _take(self, where: str) -> torch.Tensor:
        self._count(where, self.buffer_bytes)
        if self._free[where]:
            return self._free[where].pop()
        if where == "device":
            return torch.empty(self.numel, dtype=self.dtype, device=self.device)
        return torch.empty(self.numel, dtype=self.dtype, pin_memory=(where == "pinned_host"))

    def _parts(self, grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        return [
            torch.zeros(n, dtype=self.dtype, device=self.device) if g is None else g.reshape(-1).to(self.dtype)
            for g, n in zip(grads, self._numels)
        ]

    def flatten(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """A flat buffer at the storage location holding per-parameter grads (None -> zeros)."""
        if self.on_device or self.device.type == "cpu":  # same memory space: concatenate in place
            return torch.cat(self._parts(grads), out=self._take(self._where))
        return self.adopt(self._staged(grads))

    def _staged(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """Grads concatenated into one reused device buffer (valid until the next call)."""
        if self._staging is None:
            self._staging = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        return torch.cat(self._parts(grads), out=self._staging)

    def adopt(self, flat: torch.Tensor) -> torch.Tensor:
        """Copy a device flat buffer to a buffer at the storage location."""
        buf = self._take(self._where)
        # A blocking copy: the host reads the buffer right after (a non_blocking copy would race).
        buf.copy_(flat)
        return buf

    def scaled(self, flat: torch.Tensor, alpha: float) -> torch.Tensor:
        """A new buffer at the storage location holding ``alpha * flat`` (same location as flat)."""
        return torch.mul(flat, alpha, out=self._take(self._where))

    def add_grads(self, buf: torch.Tensor, grads: Sequence[torch.Tensor | None], alpha: float = 1.0) -> None:
        """``buf += alpha * grads`` without building a flat copy when the buffer is on the device."""
        if not self.on_device:
            buf.add_(self._staged(grads).to(buf.device), alpha=alpha)
            return
        pairs = [(v, g.to(self.dtype)) for v, g in zip(self.split(buf), grads) if g is not None]
        if pairs:
            torch._foreach_add_([v for v, _ in pairs], [g for _, g in pairs], alpha=alpha)

    def zeros_on_device(self) -> torch.Tensor:
        """The step's folded gradient: always on the parameters' device."""
        return self._take("device").zero_()

    def release(self, *buffers: torch.Tensor | None) -> None:
        """Return buffers the caller drops to the free list (the caller forgets its references)."""
        for b in buffers:
            if b is not None:
                self._count(self._where, -self.buffer_bytes)
                self._free[self._where].append(b)

    def release_device(self, buffer: torch.Tensor) -> None:
        self._count("device", -self.buffer_bytes)
        self._free["device"].append(buffer)

    def to_device(self, flat: torch.Tensor) -> torch.Tensor:
        return flat if flat.device == self.device else flat.to(self.device)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a flat buffer in parameter shapes."""
        return [v.view(s) for v, s in zip(flat.split(self._numels), self._shapes)]

    def current(self) -> ByteUsage:
        return ByteUsage(**self._current)

    def peak(self) -> ByteUsage:
        return ByteUsage(**self._peak)
