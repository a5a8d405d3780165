"""Device-to-host copies of gradient buffers that overlap the next backward (``offload="pinned"``).

A :class:`CopyEngine` starts a copy and hands back a ticket; two waits order it against the rest:

- :meth:`~CopyEngine.wait_on_compute`: work queued on the compute stream after this call runs only
  once the copy has read its source (the source staging buffer may then be overwritten), without
  blocking the host;
- :meth:`~CopyEngine.synchronize`: the host waits until the copy has landed (the destination may
  then be read or reused).

:class:`CudaCopies` runs copies on a side CUDA stream (``non_blocking`` into page-locked memory);
the host buffer must not be read, and the device source not overwritten, before the matching wait.
:class:`~thundersync_lightning.core.gradients.storage.GradientStore` keeps that protocol (double-buffered
staging, a wait before every host read, release only after the copy landed); tests drive it with a
fake engine that moves the data only when waited on, so any missing wait shows up as a wrong sum.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

__all__ = ["CopyEngine", "CudaCopies"]


class CopyEngine(Protocol):
    def copy(self, dst: Tensor, src: Tensor) -> object:
        """Start ``dst.copy_(src)`` (device -> host) after the compute work queued so far; a ticket."""
        ...

    def wait_on_compute(self, ticket: object) -> None:
        """Compute work queued from now on starts after the copy has read its source."""
        ...

    def synchronize(self, ticket: object) -> None:
        """Block the host until the copy has landed in its destination."""
        ...


class CudaCopies:
    """Copies on a side stream of ``device``; a ticket is the :class:`torch.cuda.Event` of its end."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def copy(self, dst: Tensor, src: Tensor) -> torch.cuda.Event:
        # the source was written by kernels on the compute stream: the side stream waits for them
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self.stream)
        src.record_stream(self.stream)  # the caching allocator must not hand src out mid-copy
        return done

    def wait_on_compute(self, ticket: object) -> None:
        torch.cuda.current_stream(self.device).wait_event(ticket)  # type: ignore[arg-type]

    def synchronize(self, ticket: object) -> None:
        ticket.synchronize()  # type: ignore[attr-defined]
