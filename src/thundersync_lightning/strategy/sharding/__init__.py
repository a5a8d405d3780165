"""Data-parallel layouts of the learner: ``ThunderSyncStrategy(sharding="none" | "zero1" | "fsdp2")``.

See :mod:`.base` for the moments of a step a layout acts at and the invariant it keeps.
"""

from __future__ import annotations

from .base import Layout, Replicated, Sharding
from .fsdp2 import FSDP2, shard_units
from .zero1 import ZeRO1

__all__ = ["Sharding", "Layout", "SHARDINGS", "build_layout", "ZeRO1", "FSDP2", "shard_units"]

SHARDINGS: dict[str, type[Layout]] = {"none": Replicated, "zero1": ZeRO1, "fsdp2": FSDP2}


def build_layout(name: Sharding, distributed: bool) -> Layout:
    """The layout registered under ``name`` (validated by the strategy's constructor)."""
    return SHARDINGS[name](distributed)
