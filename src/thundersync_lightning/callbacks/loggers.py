"""The default logger: Lightning's ``WandbLogger``, offline unless the user asks for online.

The mode goes to ``wandb.init(mode=...)`` through the logger's kwargs. ``WandbLogger(offline=True)``
is avoided on purpose: it sets ``WANDB_MODE=dryrun`` for the whole process, which leaks into every
later logger. Resolution of the mode, first match wins:

1. an explicit ``mode`` ("online", "offline", "disabled", "shared");
2. ``WANDB_MODE`` in the environment (left to wandb itself);
3. inside a sweep agent (``WANDB_SWEEP_ID`` set): "online", so runs report to their sweep;
4. "offline": runs are written under ``<save_dir>/wandb/offline-run-*`` and can be uploaded later
   with ``wandb sync``.

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

__all__ = ["ThunderSyncWandbLogger", "default_wandb_logger", "resolve_wandb_mode"]

log = logging.getLogger(__name__)

WandbMode = Literal["online", "offline", "disabled", "shared"]


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
        **kwargs: passed on to ``WandbLogger`` and from it to ``wandb.init``.
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | None = None,
        project: str = "thundersync-lightning",
        mode: WandbMode | None = None,
        log_model: Literal["all"] | bool = False,
        **kwargs: Any,
    ) -> None:
        if kwargs.pop("offline", False):
            raise ValueError(
                "ThunderSyncWandbLogger(offline=...) would set WANDB_MODE for the whole process; "
                'pass mode="offline" or mode="online" instead.'
            )
        resolved = resolve_wandb_mode(mode)
        if resolved is not None:
            kwargs["mode"] = resolved
        save_dir = save_dir or "."  # the CLI fills an unset save_dir with the run's default_root_dir
        os.makedirs(save_dir, exist_ok=True)
        super().__init__(name=name, save_dir=save_dir, project=project, log_model=log_model, **kwargs)


def default_wandb_logger(save_dir: str = ".", **kwargs: Any) -> ThunderSyncWandbLogger:
    """The logger the default configs use: :class:`ThunderSyncWandbLogger` with ``kwargs``."""
    return ThunderSyncWandbLogger(save_dir=save_dir, **kwargs)
