"""ZeRO stage 1: optimizer state sharded over data-parallel ranks (``sharding="zero1"``).

Weights and gradients stay replicated: the barrier all-reduces the folded gradient as plain data
parallelism does, so clipping sees the global gradient norm on every rank. The optimizer is
torch's :class:`~torch.distributed.optim.ZeroRedundancyOptimizer` built from the module's own
optimizer (class, hyperparameters and parameter groups): rank r keeps the state (AdamW: two moments)
of the parameters in its partition only, steps them, and broadcasts them to the other ranks. The
update equals the unsharded optimizer's; optimizer-state memory per rank drops to about 1/W.

Checkpoints: ``optimizer.state_dict()`` of a ZeroRedundancyOptimizer is the *consolidated* state of
every rank, and only after ``consolidate_state_dict()`` (a collective). Lightning's
``Strategy.optimizer_state`` does exactly that on every rank and keeps it on rank 0, which writes the
checkpoint; so a ZeRO-1 checkpoint holds the full optimizer state, loads into any world size
(``load_state_dict`` keeps each rank's partition) and into ``sharding="none"``.

.. warning:: Gradients are all-reduced, not reduce-scattered to their owners: communication is that
   of plain DP, the saving is optimizer memory only.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence
from functools import wraps
from typing import Any

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from .base import Layout, Sharding

__all__ = ["ZeRO1"]

log = logging.getLogger(__name__)


class ZeRO1(Layout):
    """Optimizer state partitioned by parameter over ranks (torch's ZeroRedundancyOptimizer)."""

    name: Sharding = "zero1"

    def wrap_optimizers(self, optimizers: list[Any], lr_scheduler_configs: Sequence[Any]) -> list[Any]:
        if not self.distributed:
            log.info("sharding='zero1' in one process: nothing to shard, the optimizer is used as it is")
            return optimizers
        wrapped = [self._wrap(opt) for opt in optimizers]
        for config in lr_scheduler_configs:
            for old, new in zip(optimizers, wrapped):
                if config.scheduler.optimizer is old:
                    _repoint(config.scheduler, old, new)
        return wrapped

    @staticmethod
    def _wrap(optimizer: torch.optim.Optimizer) -> ZeroRedundancyOptimizer:
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            return optimizer
        if optimizer.state:
            raise RuntimeError("sharding='zero1' wraps a fresh optimizer; this one already has state")
        # every key of every group (lr, betas, initial_lr set by a scheduler, ...) carries over; the
        # defaults only as far as the constructor takes them (AdamW records a key its __init__ lacks)
        accepted = inspect.signature(type(optimizer)).parameters
        defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params"}
        groups = [dict(group) for group in optimizer.param_groups]
        zero = ZeroRedundancyOptimizer(groups, optimizer_class=type(optimizer), **defaults)
        return zero


def _repoint(scheduler: Any, old: Any, new: Any) -> None:
    """Point an LR scheduler built on ``old`` at ``new``.

    Schedulers read and write ``optimizer.param_groups``; ZeRO's groups carry the same keys (including
    ``initial_lr``) and are copied into its local optimizer before every step. torch's LRScheduler also
    wraps ``optimizer.step`` to warn when the scheduler steps first; the same marker goes on ``new``.
    """
    scheduler.optimizer = new
    if hasattr(old.step, "_wrapped_by_lr_sched") and not hasattr(new.step, "_wrapped_by_lr_sched"):
        step = new.step

        @wraps(step)
        def tracked(*args: Any, **kwargs: Any) -> Any:
            new._opt_called = True
            return step(*args, **kwargs)

        tracked._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
        new.step = tracked
