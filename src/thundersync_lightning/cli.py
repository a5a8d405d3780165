"""The ``thundersync-lightning`` command: LightningCLI over ``GRPOPolicy`` and ``RolloutDataModule``.

    thundersync-lightning fit --config configs/toy.yaml \\
        --trainer.strategy.init_args.mode=sync --trainer.max_steps=50 --trainer.default_root_dir=runs/x

Every run writes ``DIR/summary.json`` (see :mod:`thundersync_lightning.summary`) and, with a
``ModelCheckpoint`` whose ``dirpath`` is unset, checkpoints under ``DIR/checkpoints/``
(``last.ckpt`` with ``save_last``). Resume with ``--ckpt_path DIR/checkpoints/last.ckpt``.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from typing_extensions import override

from .modules import GRPOPolicy, RolloutDataModule
from .summary import RunSummary

__all__ = ["ThunderSyncCLI", "main", "build_parser"]


class ThunderSyncCLI(LightningCLI):
    @override
    def before_instantiate_classes(self) -> None:
        # A logger whose save_dir is unset writes into the run's directory, so overriding
        # --trainer.default_root_dir moves everything of a run together.
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        trainer = config.get("trainer") if config is not None else None
        if trainer is None:
            return
        loggers = trainer.get("logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            init_args = getattr(logger, "init_args", None)
            if init_args is not None and "save_dir" in init_args and init_args.get("save_dir") is None:
                init_args["save_dir"] = trainer.get("default_root_dir") or "."

    @override
    def before_fit(self) -> None:
        root = self.trainer.default_root_dir
        for cb in self.trainer.callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                cb.dirpath = os.path.join(root, "checkpoints")
        if not any(isinstance(cb, RunSummary) for cb in self.trainer.callbacks):
            self.trainer.callbacks.append(RunSummary())


def _cli_kwargs() -> dict[str, Any]:
    return {
        "model_class": GRPOPolicy,
        "datamodule_class": RolloutDataModule,
        "save_config_kwargs": {"overwrite": True},
    }


class _ParserReady(Exception):
    pass


def build_parser() -> Any:
    """The CLI's parser (keys as in ``fit``: ``trainer.*``, ``model.*``, ``data.*``), without running.

    Used to check that sweep parameters are valid CLI keys.
    """
    holder: dict[str, Any] = {}

    class _Probe(ThunderSyncCLI):
        @override
        def parse_arguments(self, parser: Any, args: Any) -> None:
            holder["parser"] = parser
            raise _ParserReady

    try:
        _Probe(**_cli_kwargs(), run=False, args=[])
    except _ParserReady:
        pass
    return holder["parser"]


def main(args: list[str] | None = None) -> None:
    import thundersync_lightning  # noqa: F401  registers strategy="thundersync"

    ThunderSyncCLI(**_cli_kwargs(), args=args)


if __name__ == "__main__":
    main()
