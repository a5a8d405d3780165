"""``ValidateAtStart``: one validation run before the first training step.

Lightning validates after ``val_check_interval`` training batches (and its sanity check logs
nothing), so the untrained policy's held-out score would be missing from every curve. This
callback runs the fit's own validation loop once in ``on_train_start``, exactly as the training
epoch loop does between batches, so ``val/pass_at_1`` at step 0 is logged (and is the
``val_pass_at_1_first`` of ``summary.json``).
"""

from __future__ import annotations

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

__all__ = ["ValidateAtStart"]


class ValidateAtStart(Callback):
    """Validate the initial (or resumed) weights before training starts."""

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.enable_validation:
            return
        trainer.validating = True  # selects the validation loop as the active one
        trainer.fit_loop.epoch_loop.val_loop.run()
        trainer.training = True
