"""Where the learner's weights, gradients and optimizer state live across data-parallel ranks.

The strategy has no DDP wrapper (per-trajectory ``autograd.grad`` calls would not feed its
reducer): each rank folds its own groups' gradient g_r into ``.grad`` at the barrier, and the
layout makes the optimizer see g = sum_r g_r (every rank already divided by the global normaliser,
so a SUM is the mean gradient of the batch). A layout acts at five moments of a step:

1. ``shard(module)``: set-up, after every rank holds rank 0's weights;
2. ``wrap_optimizers``: set-up, after ``configure_optimizers`` (LR schedulers re-pointed);
3. ``gather(module)``: before the step's first forward, ``module.parameters()`` become the full
   weights theta_v and stay so (frozen) until the barrier;
4. ``reduce_gradients(module)``: the barrier, g into the optimizer's parameters' ``.grad``;
5. ``after_optimizer_step(module)``: theta_{v+1} back into ``module.parameters()``.

Invariant: between ``gather`` and ``reduce_gradients`` no parameter changes (``check_frozen``
raises otherwise), so every trajectory of the step is differentiated at theta_v.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["Sharding", "Layout", "Replicated", "trainable", "all_reduce_grads"]

Sharding = Literal["none", "zero1", "fsdp2"]


def trainable(module: nn.Module) -> list[tuple[str, Tensor]]:
    """The module's registered trainable parameters by name, in registration order."""
    return [(n, p) for n, p in module.named_parameters() if p.requires_grad]


def all_reduce_grads(params: Sequence[Tensor]) -> None:
    """``.grad`` <- sum over ranks, as one coalesced collective (a missing ``.grad`` counts as zero)."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat)  # SUM: every rank already divided by the global group count
    for p, chunk in zip(params, flat.split([g.numel() for g in grads])):
        p.grad = chunk.view_as(p).clone()


class Layout:
    """Every weight, gradient and optimizer state replicated on every rank (``sharding="none"``).

    Subclasses override the moments they change; the defaults are plain data parallelism.
    ``distributed`` is False in a single process without a process group: nothing to reduce.
    """

    name: Sharding = "none"

    def __init__(self, distributed: bool) -> None:
        self.distributed = distributed

    @classmethod
    def problems(cls, processes: int) -> list[str]:
        """What makes this layout unusable with ``processes`` data-parallel processes (checked at set-up)."""
        return []

    def shard(self, module: nn.Module, device: torch.device) -> None:
        """Set-up: called once, after rank 0's weights were broadcast, before the optimizers exist."""

    def wrap_optimizers(self, optimizers: list[Any], lr_scheduler_configs: Sequence[Any]) -> list[Any]:
        """Set-up: the optimizers to step (LR schedulers in ``lr_scheduler_configs`` re-pointed)."""
        return optimizers

    def gather(self, module: nn.Module) -> None:
        """Start of a step: ``module.parameters()`` hold the full current weights afterwards."""

    def check_frozen(self, module: nn.Module) -> None:
        """The barrier: raise :class:`PolicyChangedError` if the weights changed since ``gather``."""

    def reduce_gradients(self, module: nn.Module) -> None:
        """The barrier: sum every rank's folded gradient into the optimizer's parameters' ``.grad``."""
        if self.distributed:
            all_reduce_grads([p for _, p in trainable(module)])

    def after_optimizer_step(self, module: nn.Module) -> None:
        """After ``optimizer.step()``: the new weights are visible in ``module.parameters()``."""

    def weights_fn(self, module: Any) -> Callable[[], Mapping[str, Tensor]]:
        """How to read the full weights to publish to the rollout engine."""
        return module.weights_for_engine

    # ------------------------------------------------------------------ checkpoints
    def module_state_dict(self, module: nn.Module, default: Callable[[], dict]) -> dict:
        return default()

    def load_module_state_dict(
        self, module: nn.Module, state: Mapping[str, Any], default: Callable[[], None]
    ) -> None:
        default()

    def optimizer_state(self, module: nn.Module, optimizer: Any, default: Callable[[], dict]) -> dict:
        return default()

    def load_optimizer_states(
        self,
        module: nn.Module,
        optimizers: Sequence[Any],
        states: Sequence[Mapping[str, Any]],
        default: Callable[[], None],
    ) -> None:
        default()


class Replicated(Layout):
    """Plain data parallelism: the folded gradient all-reduced at the barrier."""

    name: Sharding = "none"
