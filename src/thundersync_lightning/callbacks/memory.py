"""MemoryMonitor: peak device memory, streaming-accumulator bytes, pinned host memory and RSS.

Every value is in bytes and is the maximum over ranks (the worst learner process):

==========================================  ============================================================
``memory/peak_device_bytes``                ``torch.cuda.max_memory_allocated`` since this step began
``memory/peak_device_reserved_bytes``       ``torch.cuda.max_memory_reserved`` since this step began
``memory/accumulator_{where}_bytes``        peak accumulator bytes on the device / pinned / pageable host
``memory/accumulator_total_bytes``          their sum
``memory/pinned_host_bytes``                pinned host blocks in use (``torch.cuda.host_memory_stats``
                                            ``active_bytes.current``)
``memory/pinned_host_reserved_bytes``       pinned host blocks the caching allocator holds
``memory/process_rss_bytes``                resident set size of the learner process (psutil)
==========================================  ============================================================

Device and pinned-host keys are logged only when the module runs on a CUDA device (on CPU there is
no device memory distinct from the host, which RSS covers). Device peaks are reset when each step
starts (``on_train_batch_start``).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import lightning.pytorch as pl
import psutil
import torch
from typing_extensions import override

from thundersync_lightning.callbacks.base import Max, Reduction, StepStatsCallback
from thundersync_lightning.strategy.stats import StepStats

__all__ = ["MemoryMonitor", "device_memory", "pinned_host_memory", "process_rss_bytes", "accumulator_memory"]

log = logging.getLogger(__name__)

DEVICE_KEYS = ("memory/peak_device_bytes", "memory/peak_device_reserved_bytes")
PINNED_KEYS = ("memory/pinned_host_bytes", "memory/pinned_host_reserved_bytes")
ACCUMULATOR_KEYS = (
    "memory/accumulator_device_bytes",
    "memory/accumulator_pinned_host_bytes",
    "memory/accumulator_pageable_host_bytes",
    "memory/accumulator_total_bytes",
)
RSS_KEY = "memory/process_rss_bytes"


def device_memory(device: torch.device) -> dict[str, float]:
    """Peak allocated and reserved bytes on a CUDA ``device`` since the last reset; ``{}`` otherwise."""
    if device.type != "cuda":
        return {}
    return {
        DEVICE_KEYS[0]: float(torch.cuda.max_memory_allocated(device)),
        DEVICE_KEYS[1]: float(torch.cuda.max_memory_reserved(device)),
    }


def pinned_host_memory() -> dict[str, float]:
    """Pinned host bytes in use and held by torch's host caching allocator; ``{}`` without CUDA."""
    if not torch.cuda.is_available() or not hasattr(torch.cuda, "host_memory_stats"):
        return {}
    stats = torch.cuda.host_memory_stats()
    return {
        PINNED_KEYS[0]: float(stats.get("active_bytes.current", 0)),
        PINNED_KEYS[1]: float(stats.get("allocated_bytes.current", 0)),
    }


def process_rss_bytes() -> float:
    return float(psutil.Process().memory_info().rss)


class _Bytes(Protocol):  # StepStats.accumulator: AccumulatorBytes or the core's ByteUsage
    device: int
    pinned_host: int
    pageable_host: int


def accumulator_memory(acc: _Bytes) -> dict[str, float]:
    values = (
        acc.device,
        acc.pinned_host,
        acc.pageable_host,
        acc.device + acc.pinned_host + acc.pageable_host,
    )
    return {key: float(v) for key, v in zip(ACCUMULATOR_KEYS, values)}


class MemoryMonitor(StepStatsCallback):
    """Log the memory keys of the module docstring at every step (max over ranks)."""

    def __init__(self) -> None:
        self._device = torch.device("cpu")
        super().__init__()

    @property
    def metric_keys(self) -> list[str]:
        """Every key this monitor may log (device and pinned-host keys on CUDA only)."""
        return [*DEVICE_KEYS, *ACCUMULATOR_KEYS, *PINNED_KEYS, RSS_KEY]

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._device = pl_module.device

    @override
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if pl_module.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(pl_module.device)

    @override
    def measure(self, stats: StepStats) -> dict[str, Reduction]:
        values = {**accumulator_memory(stats.accumulator), RSS_KEY: process_rss_bytes()}
        if self._device.type == "cuda":
            values.update({**device_memory(self._device), **pinned_host_memory()})
            keys = [*ACCUMULATOR_KEYS, RSS_KEY, *DEVICE_KEYS, *PINNED_KEYS]
        else:
            keys = [*ACCUMULATOR_KEYS, RSS_KEY]
        return {key: Max(values.get(key, 0.0)) for key in keys}
