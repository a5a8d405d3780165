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
- warns when a resumed fit would run no step (``max_steps`` at or below the checkpoint's step);
- records the run's mode, objective and directory in every checkpoint and refuses a resume whose
  configuration differs (a sync run resumed in streaming mode, in another directory, is another
  run that would silently continue this one's W&B run and summary). The error names each
  difference and the overrides that resume the same run; ``resume_changes="warn"`` resumes anyway
  (a new run that starts from the checkpoint's weights and state).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import WandbLogger
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from ..core.errors import ConfigError
from .loggers import CHECKPOINT_KEY

__all__ = ["RunChecks", "hidden_steps_warning", "run_identity", "resume_differences"]

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


def run_identity(trainer: pl.Trainer) -> dict[str, Any]:
    """What makes a resumed fit the same run: the strategy's mode,
    the module's objective, the run directory."""
    objective = getattr(trainer.lightning_module, "objective", None)
    return {
        "mode": getattr(trainer.strategy, "mode", None),
        "objective": objective.to_dict() if callable(getattr(objective, "to_dict", None)) else None,
        "root_dir": os.path.realpath(trainer.default_root_dir),
    }


def resume_differences(recorded: dict[str, Any], current: dict[str, Any], ckpt_path: str | None) -> list[str]:
    """Each way the current configuration differs from the checkpoint's run, with the override that
    matches it. A checkpoint read from inside the current run directory is that run (moved or renamed)."""
    out = []
    if recorded.get("mode") and current["mode"] and recorded["mode"] != current["mode"]:
        out.append(
            f"mode: the checkpoint's run trained in {recorded['mode']!r} mode, this configuration says "
            f"{current['mode']!r} (--trainer.strategy.init_args.mode={recorded['mode']})"
        )
    if recorded.get("objective") and current["objective"] and recorded["objective"] != current["objective"]:
        changed = sorted(
            k for k in set(recorded["objective"]) | set(current["objective"])
            if recorded["objective"].get(k) != current["objective"].get(k)
        )  # fmt: skip
        out.append(
            "objective: " + ", ".join(
                f"{k} {recorded['objective'].get(k)!r} in the checkpoint, "
                f"{current['objective'].get(k)!r} here"
                for k in changed
            ) + " (--model.objective as in the first fit)"
        )  # fmt: skip
    inside = ckpt_path is not None and os.path.realpath(ckpt_path).startswith(current["root_dir"] + os.sep)
    if recorded.get("root_dir") and recorded["root_dir"] != current["root_dir"] and not inside:
        out.append(
            f"run directory: the checkpoint's run writes to {recorded['root_dir']}, this one to "
            f"{current['root_dir']} (--trainer.default_root_dir={recorded['root_dir']})"
        )
    return out


class RunChecks(Callback):
    """See the module docstring. Stateless: what it keeps goes into the checkpoint dict itself.

    Args:
        resume_changes: ``"error"`` refuses to resume a checkpoint into another mode, objective or run
            directory; ``"warn"`` says so and resumes.
    """

    def __init__(self, resume_changes: Literal["error", "warn"] = "error") -> None:
        if resume_changes not in ("error", "warn"):
            raise ConfigError(f"RunChecks(resume_changes={resume_changes!r}): use 'error' or 'warn'")
        self.resume_changes = resume_changes

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
        entry["run"] = run_identity(trainer)
        run_id = _wandb_run_id(trainer)
        if run_id is not None:
            entry["wandb_run_id"] = run_id

    @override
    def on_load_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        recorded_run = checkpoint.get(CHECKPOINT_KEY, {}).get("run")
        if recorded_run and trainer.state.fn == TrainerFn.FITTING:  # validating any checkpoint is fine
            self._check_same_run(trainer, recorded_run)
        step = checkpoint.get("global_step")
        if isinstance(step, int) and trainer.max_steps is not None and 0 <= trainer.max_steps <= step:
            rank_zero_warn(
                f"Resuming from a checkpoint at step {step} with max_steps={trainer.max_steps}: this fit "
                f"runs no step (the summary will describe the {step} steps before it). Raise max_steps above "
                f"{step} (--trainer.max_steps) to train further."
            )
        recorded = checkpoint.get(CHECKPOINT_KEY, {}).get("wandb_run_id")
        current = _wandb_run_id(trainer)
        if recorded and current and recorded != current:
            rank_zero_warn(
                f"The checkpoint was logged to W&B run {recorded!r}, this fit logs to a new run {current!r}. "
                "To continue the same run pass ThunderSyncWandbLogger(resume_from_checkpoint=<the "
                "checkpoint>) (the CLI does this for --ckpt_path) or WandbLogger(id=...)."
            )

    def _check_same_run(self, trainer: pl.Trainer, recorded: dict[str, Any]) -> None:
        ckpt_path = trainer.ckpt_path
        differences = resume_differences(
            recorded, run_identity(trainer), str(ckpt_path) if ckpt_path else None
        )
        if not differences:
            return
        text = (
            f"Resuming {ckpt_path} into a different configuration:\n  - " + "\n  - ".join(differences) + "\n"
            "Give the first fit's values (the overrides in brackets) to continue that run."
        )
        if self.resume_changes == "error":
            raise ConfigError(
                text + " To start a new run from this checkpoint anyway: RunChecks(resume_changes='warn') "
                "(in a config: a RunChecks callback with init_args: {resume_changes: warn})."
            )
        rank_zero_warn(text + " Resuming anyway (resume_changes='warn').")
