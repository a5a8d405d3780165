"""Checkpoints of the strategy: the data-parallel layout decides how module and optimizer state are
saved and loaded (full state dicts under ``zero1`` and ``fsdp2``), and async mode adds the weights
that generate the next step's rollouts, for an exact resume (:mod:`.issuing`).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from .issuing import RolloutIssuer
from .sharding.base import Layout

__all__ = ["LayoutCheckpoints", "ASYNC_RESUME_KEY"]

#: The checkpoint entry holding async mode's rollout weights for an exact resume (issuing.py).
ASYNC_RESUME_KEY = "thundersync_async_rollout"


class LayoutCheckpoints(DDPStrategy):
    """Lightning's checkpoint hooks, delegated to the layout (and the async resume state)."""

    _layout: Layout
    _issuer: RolloutIssuer

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        return self._layout.module_state_dict(self.lightning_module, super().lightning_module_state_dict)

    @override
    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        default = partial(super().load_model_state_dict, checkpoint, strict)
        self._layout.load_module_state_dict(self.lightning_module, checkpoint["state_dict"], default)

    @override
    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        return self._layout.optimizer_state(self.lightning_module, optimizer, partial(super().optimizer_state, optimizer))

    @override
    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        default = partial(super().load_optimizer_state_dict, checkpoint)
        self._layout.load_optimizer_states(self.lightning_module, self.optimizers, checkpoint["optimizer_states"], default)

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        # async: the weights that generate the next step's rollouts, for an exact resume (issuing.py)
        trainer = self.lightning_module.trainer if self.lightning_module is not None else None
        state = self._issuer.resume_state(trainer.global_step) if trainer is not None else None
        if state is not None:
            checkpoint = {**checkpoint, ASYNC_RESUME_KEY: state}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, *args, **kwargs)
        self._issuer.load_resume_state(checkpoint.get(ASYNC_RESUME_KEY))
        return checkpoint
