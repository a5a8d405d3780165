"""RunChecks: run-level bookkeeping and the warnings a short RL run needs.

Every run gets it (:func:`~thundersync_lightning.callbacks.default_callbacks`, and the CLI adds it
when a config does not list it). It

- warns when ``log_every_n_steps`` would hide most steps of the run (Lightning's default 50 logs
  nothing of a 40-step run);
- puts the checkpoints of a ``ModelCheckpoint`` without ``dirpath`` under ``DIR/checkpoints``
  (``DIR`` = ``trainer.default_root_dir``), as the CLI does;
- records the W&B run id in every checkpoint (``checkpoint["thundersync_lightning"]``), so that
  ``ThunderSyncWandbLogger(resume_from_checkpoint=...)`` continues the same run, and warns when a
  resumed fit logs to another run;
- warns when a resumed fit would run no step (``max_steps`` at or below the checkpoint's step).
"""

from __future__ import annotations

import logging
import os
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from .loggers import CHECKPOINT_KEY

__all__ = ["RunChecks", "hidden_steps_warning"]

log = logging.getLogger(__name__)


def hidden_steps_warning(log_every_n_steps: int, max_steps: int) -> str | None:
    """The warning for a logging interval that leaves fewer than ~10 logged points in the run."""
    if log_every_n_steps <= 1 or max_steps is None or max_steps <= 0 or log_every_n_steps * 10 <= max_steps:
        return None
    logged = max_steps // log_every_n_steps
    return (
        f"log_every_n_steps={log_every_n_steps} with max_steps={max_steps}: only {logged} of the run's "
        f"{max_steps} steps reach the loggers (one RL step is one Trainer step). "
        "Pass Trainer(log_every_n_steps=1) (--trainer.log_every_n_steps=1) to log every step."
    )


def _wandb_run_id(trainer: pl.Trainer) -> str | None:
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger) and logger.version:
            return str(logger.version)
    return None


class RunChecks(Callback):
    """See the module docstring. Stateless: what it keeps goes into the checkpoint dict itself."""

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        message = hidden_steps_warning(trainer.log_every_n_steps, trainer.max_steps)
        if message:
            rank_zero_warn(message)
        for (
            cb
        ) in trainer.checkpoint_callbacks:  # runs before ModelCheckpoint.setup (Lightning orders it last)
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                cb.dirpath = os.path.join(trainer.default_root_dir, "checkpoints")

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        entry = checkpoint.setdefault(CHECKPOINT_KEY, {})
        run_id = _wandb_run_id(trainer)
        if run_id is not None:
            entry["wandb_run_id"] = run_id

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        step = checkpoint.get("global_step")
        if isinstance(step, int) and trainer.max_steps is not None and 0 <= trainer.max_steps <= step:
            rank_zero_warn(
                f"Resuming from a checkpoint at step {step} with max_steps={trainer.max_steps}: this fit runs no "
                f"step (the summary will describe the {step} steps before it). Raise max_steps above {step} "
                "(--trainer.max_steps) to train further."
            )
        recorded = checkpoint.get(CHECKPOINT_KEY, {}).get("wandb_run_id")
        current = _wandb_run_id(trainer)
        if recorded and current and recorded != current:
            rank_zero_warn(
                f"The checkpoint was logged to W&B run {recorded!r}, this fit logs to a new run {current!r}. "
                "To continue the same run pass ThunderSyncWandbLogger(resume_from_checkpoint=<the checkpoint>) "
                "(the CLI does this for --ckpt_path) or WandbLogger(id=...)."
            )
