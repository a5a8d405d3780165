"""The default logger: Lightning's ``WandbLogger``, offline unless the user asks for online.

The mode goes to ``wandb.init(mode=...)`` through the logger's kwargs. ``WandbLogger(offline=True)``
is avoided on purpose: it sets ``WANDB_MODE=dryrun`` for the whole process, which leaks into every
later logger. Resolution of the mode, first match wins:

1. an explicit ``mode`` ("online", "offline", "disabled", "shared");
2. ``WANDB_MODE`` in the environment (left to wandb itself);
3. inside a sweep agent (``WANDB_SWEEP_ID`` set): "online", so runs report to their sweep;
4. "offline": runs are written under ``<save_dir>/wandb/offline-run-*`` and can be uploaded later
   with ``wandb sync``.

Resuming continues the same W&B run: :class:`~thundersync_lightning.callbacks.RunChecks` stores the
run id in every checkpoint (``checkpoint["thundersync_lightning"]["wandb_run_id"]``);
``ThunderSyncWandbLogger(resume_from_checkpoint=PATH)`` (the CLI passes ``--ckpt_path`` on by
itself) reads it back and opens the run with that id and ``resume="allow"``. Offline, each fit
writes its own ``offline-run-*-<id>`` folder with the same id; ``wandb sync DIR/wandb/offline-run-*``
uploads them in start order into one run.

In a config::

    trainer:
      logger:
        class_path: thundersync_lightning.callbacks.ThunderSyncWandbLogger
        init_args: {project: thundersync-lightning, save_dir: runs/demo}
"""

from __future__ import annotations

import logging
import os
from typing import Any, Literal

from lightning.pytorch.loggers import WandbLogger

__all__ = [
    "ThunderSyncWandbLogger",
    "default_wandb_logger",
    "resolve_wandb_mode",
    "wandb_run_id_from_checkpoint",
    "CHECKPOINT_KEY",
]

#: The checkpoint entry where :class:`RunChecks` keeps run-level facts (the W&B run id).
CHECKPOINT_KEY = "thundersync_lightning"

log = logging.getLogger(__name__)

WandbMode = Literal["online", "offline", "disabled", "shared"]


def wandb_run_id_from_checkpoint(path: str | os.PathLike[str]) -> str | None:
    """The W&B run id recorded in a checkpoint (``None`` if it has none); tensors are not read."""
    import torch

    checkpoint = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    run_id = checkpoint.get(CHECKPOINT_KEY, {}).get("wandb_run_id")
    return str(run_id) if run_id else None


def resolve_wandb_mode(mode: str | None = None) -> str | None:
    """The ``mode`` to pass to ``wandb.init``; ``None`` leaves it to ``WANDB_MODE``."""
    if mode is not None:
        return mode
    if os.environ.get("WANDB_MODE"):
        return None
    if os.environ.get("WANDB_SWEEP_ID"):
        return "online"
    return "offline"


class ThunderSyncWandbLogger(WandbLogger):
    """``WandbLogger`` whose W&B mode defaults to offline (see the module docstring).

    Args:
        name: run name.
        save_dir: where ``wandb/`` goes (unset: the current directory; under the CLI, the run's
            ``trainer.default_root_dir``).
        project: W&B project.
        mode: "online", "offline", "disabled" or "shared"; ``None`` resolves it.
        log_model: as in ``WandbLogger``.
        resume_from_checkpoint: the checkpoint this fit resumes from: the W&B run recorded in it is
            continued (its id, ``resume="allow"``) unless ``id`` is given.
        **kwargs: passed on to ``WandbLogger`` and from it to ``wandb.init``.
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | None = None,
        project: str = "thundersync-lightning",
        mode: WandbMode | None = None,
        log_model: Literal["all"] | bool = False,
        resume_from_checkpoint: str | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.pop("offline", False):
            raise ValueError(
                "ThunderSyncWandbLogger(offline=...) would set WANDB_MODE for the whole process; "
                'pass mode="offline" or mode="online" instead.'
            )
        if kwargs.get("resume") is None:  # a config's `resume: null` would replace WandbLogger's "allow"
            kwargs.pop("resume", None)
        if resume_from_checkpoint is not None and not (kwargs.get("id") or kwargs.get("version")):
            run_id = wandb_run_id_from_checkpoint(resume_from_checkpoint)
            if run_id is None:
                log.warning("%s records no W&B run id: this fit opens a new W&B run", resume_from_checkpoint)
            kwargs["id"] = run_id
        self.resume_from_checkpoint = resume_from_checkpoint
        resolved = resolve_wandb_mode(mode)
        if resolved is not None:
            kwargs["mode"] = resolved
        save_dir = save_dir or "."  # the CLI fills an unset save_dir with the run's default_root_dir
        os.makedirs(save_dir, exist_ok=True)
        super().__init__(name=name, save_dir=save_dir, project=project, log_model=log_model, **kwargs)
        if self._wandb_init.get("anonymous") is None:  # wandb warns about the key itself, even when None
            self._wandb_init.pop("anonymous", None)


def default_wandb_logger(save_dir: str = ".", **kwargs: Any) -> ThunderSyncWandbLogger:
    """The logger the default configs use: :class:`ThunderSyncWandbLogger` with ``kwargs``."""
    return ThunderSyncWandbLogger(save_dir=save_dir, **kwargs)
