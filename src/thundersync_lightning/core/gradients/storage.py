"""Where the streaming accumulator keeps gradient buffers, and exact byte accounting.

``offload`` decides where per-group sums and held per-trajectory gradients live:

- ``"none"``: on the parameters' device (fastest; costs device memory),
- ``"cpu"``: pageable host memory,
- ``"pinned"``: page-locked host memory (asynchronous copies; needs an accelerator build of torch).

The step's folded gradient always stays on the parameters' device. Results are identical in every
mode: buffers hold the same dtype and are summed in the same order.

Pinned offload overlaps (:mod:`~thundersync_lightning.core.gradients.copies`): a gradient is concatenated
into one of two device *staging* buffers and copied to the host on a side stream, so the next
backward writes the other staging buffer while the copy is in flight. An add into a host sum lands
in one of two pinned *landing* buffers and is applied on the host later (when that landing buffer
is needed again or the sum is read), in the order the adds were made. Invariants: a staging buffer
is overwritten only after the copy that reads it (the compute stream waits on its event); a host
buffer is read, added to, copied to the device or released only after every copy into it landed
and every deferred add into it was applied (:meth:`GradientStore.ready`). The two staging and two
landing buffers are scratch (2 P device + 2 P pinned host in the accumulation dtype), not counted
in :class:`ByteUsage`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from ..errors import ConfigError
from .copies import CopyEngine, CudaCopies

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


class _DeferredAdd(NamedTuple):
    dst: torch.Tensor  # a host sum
    landing: torch.Tensor  # the pinned buffer the gradient is being copied into
    alpha: float
    ticket: object  # the copy's


class GradientStore:
    """Allocates flat gradient buffers in one place and counts their bytes (current and peak).

    A flat buffer holds every trainable parameter's gradient concatenated in parameter order, in
    the accumulation dtype (float32, or float64 when any parameter is float64). Released buffers
    go to a free list and are reused (also across steps): a fresh large buffer costs first-touch
    page faults comparable to a sizeable fraction of a backward pass, and page-locking one several
    times the copy: :meth:`reserve` allocates them up front. Without a reservation the peak bytes
    in use equal the bytes ever allocated.

    ``copies``: the copy engine of ``offload="pinned"`` (default: :class:`CudaCopies` when the
    parameters are on a CUDA device); tests inject a fake one to check the ordering on CPU.
    """

    def __init__(
        self, params: Sequence[torch.Tensor], offload: Offload = "none", copies: CopyEngine | None = None
    ) -> None:
        if offload not in _OFFLOADS:
            raise ConfigError(f"offload={offload!r} is not one of {_OFFLOADS}")
        if offload == "pinned" and copies is None and not torch.cuda.is_available():
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
        self._where = (
            "device" if offload == "none" else ("pinned_host" if offload == "pinned" else "pageable_host")
        )
        self._free: dict[str, list[torch.Tensor]] = {"device": [], "pinned_host": [], "pageable_host": []}
        if copies is None and offload == "pinned" and self.device.type == "cuda":
            copies = CudaCopies(self.device)
        self._copies = copies if offload == "pinned" else None
        self._staging: list[torch.Tensor | None] = [None, None]
        self._staging_copy: list[object | None] = [None, None]  # the copy reading each staging buffer
        self._landing: list[torch.Tensor | None] = [None, None]
        self._next = 0
        self._pending: dict[int, tuple[torch.Tensor, object]] = {}  # host buffer -> copy into it
        self._deferred: list[_DeferredAdd] = []
        self.reset_counters()

    def reset_counters(self) -> None:
        """A new step: nothing in use, peak restarts; the free lists are kept."""
        self.ready()
        self._current = {"device": 0, "pinned_host": 0, "pageable_host": 0}
        self._peak = dict(self._current)
        self._side_bytes = 0

    def set_side_bytes(self, nbytes: int) -> None:
        """Device bytes held outside the flat buffers (boundary-cut leaf sums, deferred gradients),
        counted with the buffers, current and peak."""
        self._count("device", nbytes - self._side_bytes)
        self._side_bytes = nbytes

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
        return self._new(where)

    def _new(self, where: str) -> torch.Tensor:
        if where == "device":
            return torch.empty(self.numel, dtype=self.dtype, device=self.device)
        pin = where == "pinned_host" and torch.cuda.is_available()  # a fake copy engine runs on CPU builds
        return torch.empty(self.numel, dtype=self.dtype, pin_memory=pin)

    def reserve(self, buffers: int) -> None:
        """Allocate up to ``buffers`` flat buffers at the storage location now, onto the free list
        (and, with pinned copies, both staging and both landing buffers), so that no backward
        allocates: page-locking a fresh buffer (``cudaHostAlloc``) or first-touching pageable
        memory takes several times the copy itself, and a held backward would wait for it.
        Reserved buffers count as in use only once taken (``current``/``peak`` are bytes in use).
        ``offload="none"`` reserves nothing: the caching allocator reuses device memory cheaply."""
        if self.offload == "none":
            return
        free = self._free[self._where]
        # host buffers are touched now (zero_): the first-touch page faults are paid here
        free.extend(self._new(self._where).zero_() for _ in range(max(0, buffers - len(free))))
        if self._copies is not None:
            for k in (0, 1):
                if self._staging[k] is None:
                    self._staging[k] = torch.empty(self.numel, dtype=self.dtype, device=self.device)
                if self._landing[k] is None:
                    self._landing[k] = self._new("pinned_host").zero_()

    @property
    def reserved(self) -> int:
        """Buffers waiting on the free list at the storage location."""
        return len(self._free[self._where])

    def _parts(self, grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        return [
            torch.zeros(n, dtype=self.dtype, device=self.device)
            if g is None
            else g.reshape(-1).to(self.dtype)
            for g, n in zip(grads, self._numels)
        ]

    def flatten(self, grads: Sequence[torch.Tensor | None]) -> torch.Tensor:
        """A flat buffer at the storage location holding per-parameter grads (None -> zeros)."""
        if self._copies is not None:  # pinned: the copy overlaps what follows (read it via ready())
            k, staging = self._stage(grads)
            host = self._take(self._where)
            self._pending[id(host)] = (host, self._start_copy(k, host, staging))
            return host
        if self.on_device or self.device.type == "cpu":  # same memory space: concatenate in place
            return torch.cat(self._parts(grads), out=self._take(self._where))
        return self.adopt(self._stage(grads, double=False)[1])

    def _stage(self, grads: Sequence[torch.Tensor | None], double: bool = True) -> tuple[int, torch.Tensor]:
        """Grads concatenated into a reused device staging buffer: alternately the two when copies
        overlap (the other one may still be read by a copy in flight), else always the first."""
        k = self._next if double else 0
        self._next = (self._next + 1) % 2 if double else self._next
        if self._staging[k] is None:
            self._staging[k] = torch.empty(self.numel, dtype=self.dtype, device=self.device)
        ticket = self._staging_copy[k]
        if ticket is not None:  # overwrite only after the copy that reads it (no host block)
            self._copies.wait_on_compute(ticket)  # type: ignore[union-attr]
            self._staging_copy[k] = None
        return k, torch.cat(self._parts(grads), out=self._staging[k])

    def _start_copy(self, k: int, dst: torch.Tensor, staging: torch.Tensor) -> object:
        ticket = self._copies.copy(dst, staging)  # type: ignore[union-attr]
        self._staging_copy[k] = ticket
        return ticket

    def ready(self, *buffers: torch.Tensor | None) -> None:
        """Block until host buffers may be read: every deferred add applied (in order), and every
        copy into ``buffers`` landed (no arguments: every pending copy)."""
        if self._copies is None:
            return
        self._apply_deferred(len(self._deferred))
        targets = [b for b in buffers if b is not None] if buffers else [b for b, _ in self._pending.values()]
        for b in targets:
            entry = self._pending.pop(id(b), None)
            if entry is not None:
                self._copies.synchronize(entry[1])

    def _apply_deferred(self, count: int) -> None:
        """Apply the oldest ``count`` deferred adds, each after its copy (and its sum's) landed."""
        todo, self._deferred = self._deferred[:count], self._deferred[count:]
        for op in todo:
            self._copies.synchronize(op.ticket)  # type: ignore[union-attr]
            entry = self._pending.pop(id(op.dst), None)
            if entry is not None:
                self._copies.synchronize(entry[1])  # type: ignore[union-attr]
            op.dst.add_(op.landing, alpha=op.alpha)

    def adopt(self, flat: torch.Tensor) -> torch.Tensor:
        """Copy a device flat buffer to a buffer at the storage location."""
        buf = self._take(self._where)
        # A blocking copy: the host reads the buffer right after (a non_blocking copy would race).
        buf.copy_(flat)
        return buf

    def scaled(self, flat: torch.Tensor, alpha: float) -> torch.Tensor:
        """A new buffer at the storage location holding ``alpha * flat`` (same location as flat)."""
        self.ready(flat)
        return torch.mul(flat, alpha, out=self._take(self._where))

    def add_flat(self, dst: torch.Tensor, src: torch.Tensor, alpha: float = 1.0) -> None:
        """``dst += alpha * src`` for two buffers at the storage location."""
        self.ready(dst, src)
        dst.add_(src, alpha=alpha)

    def add_grads(self, buf: torch.Tensor, grads: Sequence[torch.Tensor | None], alpha: float = 1.0) -> None:
        """``buf += alpha * grads`` without building a flat copy when the buffer is on the device."""
        if self._copies is not None:  # copy now, add on the host once the landing buffer is needed again
            k, staging = self._stage(grads)
            landing = self._landing_buffer(k)
            self._deferred.append(_DeferredAdd(buf, landing, alpha, self._start_copy(k, landing, staging)))
            return
        if not self.on_device:
            buf.add_(self._stage(grads, double=False)[1].to(buf.device), alpha=alpha)
            return
        pairs = [(v, g.to(self.dtype)) for v, g in zip(self.split(buf), grads) if g is not None]
        if pairs:
            torch._foreach_add_([v for v, _ in pairs], [g for _, g in pairs], alpha=alpha)

    def zeros_on_device(self) -> torch.Tensor:
        """The step's folded gradient: always on the parameters' device."""
        return self._take("device").zero_()

    def _landing_buffer(self, k: int) -> torch.Tensor:
        landing = self._landing[k]
        if landing is None:
            landing = self._landing[k] = self._new("pinned_host")
        uses = [i for i, op in enumerate(self._deferred) if op.landing is landing]
        if uses:  # its previous add (and every older one, to keep the order) is applied first
            self._apply_deferred(uses[-1] + 1)
        return landing

    def release(self, *buffers: torch.Tensor | None) -> None:
        """Return buffers the caller drops to the free list (the caller forgets its references)."""
        live = [b for b in buffers if b is not None]
        if live:  # never hand out a buffer a copy or a deferred add still writes
            self.ready(*live)
        for b in buffers:
            if b is not None:
                self._count(self._where, -self.buffer_bytes)
                self._free[self._where].append(b)

    def release_device(self, buffer: torch.Tensor) -> None:
        self._count("device", -self.buffer_bytes)
        self._free["device"].append(buffer)

    def to_device(self, flat: torch.Tensor) -> torch.Tensor:
        self.ready(flat)
        return flat if flat.device == self.device else flat.to(self.device)

    def split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a flat buffer in parameter shapes."""
        return [v.view(s) for v, s in zip(flat.split(self._numels), self._shapes)]

    def current(self) -> ByteUsage:
        return ByteUsage(**self._current)

    def peak(self) -> ByteUsage:
        return ByteUsage(**self._peak)
