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
    the accumulation dtype (float32, or float64 when any parameter is float64).
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
        self._current = {"device": 0, "pinned_host": 0, "pageable_host": 0}
        self._peak = dict(self._current)

    @property
    def buffer_bytes(self) -> int:
        return self.numel * torch.empty((), dtype=self.dtype).element_size()

    def _count(self, where: str, nbytes: int) -> None:
        self._current[where] += nbytes
        if nbytes > 0:
            self._peak[where] = max(self._peak[where], self._current[where])

    def flatten(self, grads: Sequence[torch.Tensor | None], scale: float | None = None) -> torch.Tensor:
        """One new flat buffer on the storage location from per-parameter grads (None -> zeros)."""
        parts = [
            torch.zeros(n, dtype=self.dtype, device=self.device) if g is None else g.reshape(-1).to(self.dtype)
            for g, n in zip(grads, self._numels)
        ]
        flat = torch.cat(parts)
        if scale is not None:
            flat.mul_(scale)
        return self.adopt(flat)

    def adopt(self, flat: torch.Tensor) -> torch.Tensor:
        """Move a device flat buffer to the storage location and count it."""
        if self.offload == "cpu":
            flat = flat.to("cpu")
        elif self.offload == "pinned":
            host = torch.empty(flat.shape, dtype=flat.dtype, pin_memory=True)
            host.copy_(flat, non_blocking=True)
            flat = host
        return self.track(flat)

    def track(self, flat: torch.Tensor) -> torch.Tensor:
        """Count a new buffer already at the storage location."""
        self._count(self._where, self.buffer_bytes)
        return flat

    def zeros_on_device(self) -> torch.Tensor:
        """The step's folded gradient: always on the parameters' device."""
        self._count("device", self.buffer_bytes)
        return torch.zeros(self.numel, dtype=self.dtype, device=self.device)

    def release(self, *buffers: torch.Tensor | None) -> None:
        """Forget buffers the caller drops (the caller deletes its references)."""
        for b in buffers:
            if b is not None:
                self._count(self._where, -self.buffer_bytes)

    def release_device(self) -> None:
        self._count("device", -self.buffer_bytes)

    def to_device(self, flat: torch.Tensor) -> torch.Tensor:
        return flat.to(self.device, non_blocking=True)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a flat buffer in parameter shapes."""
        return [v.view(s) for v, s in zip(flat.split(self._numels), self._shapes)]

    def current(self) -> ByteUsage:
        return ByteUsage(**self._current)

    def peak(self) -> ByteUsage:
        return ByteUsage(**self._peak)
