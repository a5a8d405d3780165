"""The ``thundersync-lightning`` command: LightningCLI over ``GRPOPolicy`` and ``RolloutDataModule``.

    thundersync-lightning fit --config configs/toy.yaml \\
        --trainer.strategy.init_args.mode=sync --trainer.max_steps=50 --trainer.default_root_dir=runs/x

Every run writes ``DIR/summary.json`` and ``DIR/reward_curve.png`` (see
:mod:`thundersync_lightning.summary`) and, with a ``ModelCheckpoint`` whose ``dirpath`` is unset,
checkpoints under ``DIR/checkpoints/`` (``last.ckpt`` with ``save_last``). Resume with
``--ckpt_path DIR/checkpoints/last.ckpt``: the W&B run recorded in the checkpoint is continued.

What the CLI adds to a config, so that a config and the Python path
(``callbacks=default_callbacks()``) give the same run:

- ``RunSummary``, ``RunChecks`` and ``RolloutMetrics`` (the rollout keys and the failure warnings) when the
  config lists none, and ``InterruptCheckpoint`` (``last.ckpt``
  on Ctrl-C, an exception and at the fit's end) when checkpointing is on and the config lists none;
- a logger whose ``save_dir`` is unset (``save_dir: null``, or ``--trainer.logger=CSVLogger`` or a
  config's ``logger: {class_path: CSVLogger}`` for a logger that requires one) writes into ``DIR``;
- ``--trainer.enable_progress_bar=false`` drops the config's progress bar callback instead of
  failing on it; a config that lists no progress bar gets ``RolloutProgressBar`` (steps, not epochs);
- with ``--ckpt_path``, a ``WandbLogger`` without an ``id`` gets the run id the checkpoint recorded.

``thundersync-lightning plan --config X [--device_memory 80GB] [--host_memory 512GB] [fit's
overrides]`` prints the learner's memory plan of that config (docs/scaling.md) without building
anything: the same YAML and overrides as ``fit``, parsed by the same parser. Capacities default to
this machine's (the GPU's total memory, the available RAM; a CPU config's device is the host);
sizes read ``80GB`` (10^9), ``80GiB`` (2^30), ``512MiB``. ``--device_memory`` alone describes another
machine: its host memory is then checked only with ``--host_memory``. Exit status 1 when the plan
does not fit, with the settings that would make it fit.

``thundersync-lightning verify --config X [--tolerance T] [fit's overrides]`` runs one step of sync
on the config's engine (its rollouts recorded) and one of streaming on their replay, from the
config's weights, on one device, and prints the relative gradient difference (whole and worst
parameter) and the engine-vs-learner KL (:mod:`thundersync_lightning.verify`, docs/verify.md).
Exit status 0 within the precision's tolerance, 1 past it, 2 when it cannot conclude.

``thundersync-lightning export --ckpt_path X --out DIR [--adapter-only] [--tokenizer DIR]`` writes a
checkpoint as a Hugging Face model directory (LoRA merged by default) with its tokenizer and chat
template (:mod:`thundersync_lightning.export`).

Errors: a mistyped option or value is reported in a few lines with the valid choices and a "did
you mean" (:mod:`thundersync_lightning.cli_errors`); a ``ConfigError`` found while the run is set up
is printed without its traceback. Both exit with status 2; ``THUNDERSYNC_TRACEBACK=1`` shows the
full report.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from dataclasses import replace
from typing import Any

import psutil
import torch
import yaml
from jsonargparse import ArgumentParser, Namespace
from lightning.pytorch import loggers as pl_loggers
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint, ProgressBar
from lightning.pytorch.cli import LightningCLI
from typing_extensions import override

from .callbacks import (
    InterruptCheckpoint,
    RolloutMetrics,
    RolloutProgressBar,
    RunChecks,
    RunSummary,
    wandb_run_id_from_checkpoint,
)
from .cli_errors import ShortArgumentParser, ShortErrorParser, short_config_error, wants_traceback
from .core.contract import check_engine, raise_contract_problems
from .core.errors import ConfigError, RunFailed
from .core.grpo.objective import Objective
from .core.protocols import EngineFactory, EngineFootprint
from .core.types import ModelSpec
from .export import export_main
from .modules import GRPOPolicy, RolloutDataModule
from .modules.policy import TINY_QWEN3
from .modules.shape import model_shape
from .planning.memory_fit import HOST_UNCHECKED
from .planning.memory_plan import MemoryPlan, auto_batch_trajectories, format_bytes, parse_bytes, plan_memory
from .strategy import ThunderSyncStrategy
from .strategy.memory_check import SCORING_KEYS, param_bytes, plan_inputs
from .verify import BF16_TOLERANCE, FP32_TOLERANCE, VerifyError, verify_step

__all__ = [
    "ThunderSyncCLI",
    "main",
    "build_parser",
    "config_plan",
    "plan_main",
    "verify_main",
    "OWN_COMMANDS",
]

log = logging.getLogger(__name__)

#: The save_dir given to a logger named on the command line without one; replaced by DIR.
RUN_DIR = "<run directory>"


def _resolve_class(name: str) -> type | None:
    """A class from a config's class_path or a short logger name (``CSVLogger``)."""
    module, _, attr = name.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr) if module else getattr(pl_loggers, name, None)
    except (ImportError, AttributeError):
        return None


def _requires_save_dir(name: str) -> bool:
    cls = _resolve_class(name)
    if cls is None:
        return False
    param = inspect.signature(cls).parameters.get("save_dir")
    return param is not None and param.default is inspect.Parameter.empty


def _config_logger(path: str) -> str | None:
    """The class_path of a config file's single ``trainer.logger`` that names no ``save_dir``."""
    try:
        with open(path) as f:
            logger = (yaml.safe_load(f) or {}).get("trainer", {}).get("logger")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    if not isinstance(logger, dict) or "save_dir" in (logger.get("init_args") or {}):
        return None
    return logger.get("class_path")


def with_logger_save_dir(args: list[str]) -> list[str]:
    """A logger that requires ``save_dir`` and is given none (``--trainer.logger=CSVLogger``, or a
    ``--config`` file's logger): add ``--trainer.logger.init_args.save_dir=RUN_DIR`` after it,
    replaced by the run's directory before the classes are instantiated."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--trainer.logger="):
            name, taken = arg.split("=", 1)[1], [arg]
        elif arg == "--trainer.logger" and i + 1 < len(args):
            name, taken = args[i + 1], [arg, args[i + 1]]
        elif arg.startswith("--config="):
            name, taken = _config_logger(arg.split("=", 1)[1]), [arg]
        elif arg in ("--config", "-c") and i + 1 < len(args):
            name, taken = _config_logger(args[i + 1]), [arg, args[i + 1]]
        else:
            out.append(arg)
            i += 1
            continue
        out += taken
        i += len(taken)
        later = args[i:]
        given = any(
            a.startswith(("--trainer.logger.save_dir", "--trainer.logger.init_args.save_dir")) for a in later
        )
        if name and not given and _requires_save_dir(name):
            out.append(f"--trainer.logger.init_args.save_dir={RUN_DIR}")
    return out


def _is_subclass(entry: Any, base: type) -> bool:
    cls = _resolve_class(str(getattr(entry, "class_path", "")))
    return isinstance(cls, type) and issubclass(cls, base)


#: The commands run before LightningCLI (``main``), listed beside fit/validate/... by ``--help``.
OWN_COMMANDS = {
    "verify": "One step of streaming and one of sync on the same trajectories: is streaming the sync update?",
    "plan": "The learner's memory plan of a fit config, and whether it fits this (or another) machine.",
    "export": (
        "A checkpoint as a Hugging Face model directory (LoRA merged, or --adapter-only) with its tokenizer."
    ),
}


class ThunderSyncCLI(LightningCLI):
    @override
    def _add_subcommands(self, parser: Any, **kwargs: Any) -> None:
        super()._add_subcommands(parser, **kwargs)
        for name, description in OWN_COMMANDS.items():  # help and "choose from" only: main runs them
            own = ArgumentParser(prog=f"thundersync-lightning {name}", description=description)
            parser._subcommands_action.add_subcommand(name, own, help=description)

    @override
    def parse_arguments(self, parser: Any, args: Any) -> None:
        if args is None or isinstance(args, list):
            args = with_logger_save_dir(sys.argv[1:] if args is None else list(args))
            self.config = parser.parse_args(args)
        else:
            super().parse_arguments(parser, args)

    @override
    def before_instantiate_classes(self) -> None:
        # A logger whose save_dir is unset writes into the run's directory, so overriding
        # --trainer.default_root_dir moves everything of a run together.
        config = self.config.get(self.subcommand) if self.subcommand else self.config
        trainer = config.get("trainer") if config is not None else None
        if trainer is None:
            return
        loggers = trainer.get("logger")
        ckpt_path = config.get("ckpt_path")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            init_args = getattr(logger, "init_args", None)
            if init_args is None:
                continue
            if "save_dir" in init_args and init_args.get("save_dir") in (None, RUN_DIR):
                init_args["save_dir"] = trainer.get("default_root_dir") or "."
            if ckpt_path and os.path.isfile(ckpt_path) and "id" in init_args and not init_args.get("id"):
                if _is_subclass(logger, pl_loggers.WandbLogger):
                    init_args["id"] = wandb_run_id_from_checkpoint(ckpt_path)  # continue the same W&B run
        callbacks = trainer.get("callbacks")
        if trainer.get("enable_progress_bar") is False and isinstance(callbacks, list):
            bars = [cb for cb in callbacks if _is_subclass(cb, ProgressBar)]
            if bars:
                log.info("enable_progress_bar=false: leaving out %s", ", ".join(b.class_path for b in bars))
                trainer["callbacks"] = [cb for cb in callbacks if cb not in bars]
        elif trainer.get("enable_progress_bar") is not False:
            listed = callbacks if isinstance(callbacks, list) else [] if callbacks is None else [callbacks]
            if not any(_is_subclass(cb, ProgressBar) for cb in listed):
                # Lightning's default bar counts epochs ("Epoch 0/-2" under max_steps) and redraws in a log
                bar = Namespace(
                    class_path=f"{RolloutProgressBar.__module__}.RolloutProgressBar", init_args=Namespace()
                )
                trainer["callbacks"] = [*listed, bar]

    @override
    def before_fit(self) -> None:
        self._complete_callbacks()

    def before_validate(self) -> None:
        # the same callbacks as the fit that wrote the checkpoint: Lightning warns about any missing
        # one whose state the checkpoint holds, and a ModelCheckpoint keeps the run's directory
        self._complete_callbacks()

    def _complete_callbacks(self) -> None:
        root = self.trainer.default_root_dir
        for cb in self.trainer.callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath is None:
                cb.dirpath = os.path.join(root, "checkpoints")
        callbacks = self.trainer.callbacks
        for kind in (RunSummary, RunChecks, RolloutMetrics):
            if not any(isinstance(cb, kind) for cb in callbacks):
                # before the checkpoint callbacks (Lightning keeps them last), so that a checkpoint
                # saved at a step's end holds the summary of that step
                at = next((i for i, cb in enumerate(callbacks) if isinstance(cb, Checkpoint)), len(callbacks))
                callbacks.insert(at, kind())
        if callbacks and any(isinstance(cb, Checkpoint) for cb in callbacks):
            if not any(isinstance(cb, InterruptCheckpoint) for cb in callbacks):
                callbacks.append(InterruptCheckpoint())  # last.ckpt on Ctrl-C, an exception, the fit's end


def _cli_kwargs() -> dict[str, Any]:
    return {
        "model_class": GRPOPolicy,
        "datamodule_class": RolloutDataModule,
        "save_config_kwargs": {"overwrite": True},
        "parser_class": ShortErrorParser,  # errors in a few lines (cli_errors)
        "parser_kwargs": {
            "description": "Streaming, zero-staleness GRPO for LLM agents (Lightning's CLI and more)."
        },
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


def _init_args(entry: Any) -> dict[str, Any]:
    return dict(entry.get("init_args") or {}) if isinstance(entry, dict) else {}


def _world_size(trainer: dict[str, Any], gpu: bool) -> int:
    devices = trainer.get("devices", "auto")
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    elif isinstance(devices, int) and devices > 0:
        count = devices
    elif isinstance(devices, str) and devices.strip().isdigit():
        count = int(devices)
    else:  # "auto" / -1: every GPU here (one process on a CPU)
        count = max(torch.cuda.device_count(), 1) if gpu else 1
    return count * int(trainer.get("num_nodes") or 1)


def config_plan(config: dict[str, Any]) -> MemoryPlan:
    """The memory plan of a parsed ``fit`` config (``build_parser().parse_args(...).as_dict()``)."""
    model, trainer, data = config["model"], config["trainer"], config["data"]
    spec = ModelSpec(
        model_type=model.get("model_type", "qwen3"),
        config=dict(TINY_QWEN3 if model.get("config") is None else model["config"]),
        pretrained_path=model.get("pretrained_path"),
        dtype=model.get("dtype", "float32"),
    )
    accelerator = str(trainer.get("accelerator") or "auto")
    gpu = accelerator in ("gpu", "cuda") or (accelerator == "auto" and torch.cuda.is_available())
    size = param_bytes(trainer.get("precision"), spec.dtype)
    engine = _engine_config(data.get("engine"))
    return plan_memory(
        plan_inputs(
            model=model_shape(spec, model.get("lora"), size),
            objective=Objective.of(model.get("objective")),
            accelerator="gpu" if gpu else "cpu",
            world_size=_world_size(trainer, gpu),
            strategy=_init_args(trainer.get("strategy")),
            data=data,
            engine=engine.footprint if engine is not None else EngineFootprint(),
            engine_teacher=engine is not None and engine.sampling.teacher,
            optimizer="adamw",  # GRPOPolicy.configure_optimizers
            scoring={k: model[k] for k in SCORING_KEYS if k in model},
        )
    )


def _engine_config(entry: Any) -> Any:
    """The engine config a parsed ``data.engine`` entry names, constructed as ``fit`` constructs it
    (its defaults, validation and nested configs: a pool's member too), so the plan reads the same
    declared footprint (``core.contract.ENGINE_CONTRACT``) as the set-up check; ``None``: no entry."""
    if not entry:
        return None
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--engine", type=EngineFactory)
    engine = parser.instantiate(parser.parse_object({"engine": entry})).engine
    raise_contract_problems(check_engine(engine), "data.engine")
    return engine


def plan_main(args: list[str]) -> int:
    """``thundersync-lightning plan``: print the plan and its verdict; 1 when it does not fit."""
    parser = ShortArgumentParser(
        prog="thundersync-lightning plan",
        description="The learner's memory plan of a fit config (same --config and overrides as fit).",
    )
    parser.add_argument("--device_memory", help="bytes per GPU (80GB, 80GiB; default: this machine's GPU)")
    parser.add_argument("--host_memory", help="host RAM (default: available RAM here)")
    own, rest = parser.parse_known_args(args)
    config = build_parser().parse_args(rest).as_dict()
    plan = config_plan(config)
    host = parse_bytes(own.host_memory) if own.host_memory else int(psutil.virtual_memory().available)
    if own.device_memory and not own.host_memory and plan.inputs.accelerator == "gpu":
        # a device size names another machine: this one's free RAM says nothing about its host
        host = HOST_UNCHECKED
        print("host memory not checked: pass --host_memory (the target machine's RAM) for a verdict on it")
    if own.device_memory:
        device = parse_bytes(own.device_memory)
    elif plan.inputs.accelerator == "gpu" and torch.cuda.is_available():
        device = int(torch.cuda.mem_get_info()[1])
    elif plan.inputs.accelerator == "cpu":
        device = host
    else:
        print(plan.table())
        print("no GPU on this machine: pass --device_memory (e.g. 80GB) for a verdict")
        return 0
    if _init_args(config["trainer"].get("strategy")).get("max_batch_trajectories", "auto") == "auto":
        rows = auto_batch_trajectories(plan.inputs, device, host)  # as fit resolves it on that machine
        plan = plan_memory(replace(plan.inputs, max_batch_trajectories=rows))
        print(f"max_batch_trajectories='auto': {rows} trajectories per learner call on this machine")
    print(plan.table())
    verdict = plan.fits(device, host)
    print(("FITS: " if verdict.fits else "DOES NOT FIT: ") + verdict.message())
    if verdict.fits:
        spare = device - plan.engine_reserve(device) - plan.device_bytes
        if plan.inputs.accelerator == "gpu":
            print(f"device headroom: {format_bytes(spare)}")
    return 0 if verdict.fits else 1


def _strategy_factory(entry: Any) -> Any:
    """``mode -> strategy``: the config's strategy class and options with ``mode`` replaced."""
    if entry is None or entry in ("auto", ThunderSyncStrategy.strategy_name):
        return lambda mode: ThunderSyncStrategy(mode=mode)
    name = entry if isinstance(entry, str) else str(entry.class_path)
    cls = _resolve_class(name) if "." in name else None
    if not isinstance(cls, type) or not issubclass(cls, ThunderSyncStrategy):
        raise SystemExit(f"verify: the strategy {name!r} is not a ThunderSyncStrategy (class path)")
    options = {} if isinstance(entry, str) else dict(entry.get("init_args") or {})
    return lambda mode: cls(**{**options, "mode": mode})


def verify_main(args: list[str]) -> int:
    """``thundersync-lightning verify``: print the report; 0 within tolerance, 1 past it, 2 inconclusive."""
    parser = ShortArgumentParser(
        prog="thundersync-lightning verify",
        description=(
            "One step of streaming and of sync on the same trajectories: is streaming the sync update?"
        ),
    )
    parser.add_argument(
        "--tolerance",
        type=float,
        help=f"pass bound (default: {FP32_TOLERANCE:g} in fp32, {BF16_TOLERANCE:g} in bf16)",
    )
    own, rest = parser.parse_known_args(args)
    fit_parser = build_parser()
    config = fit_parser.parse_args(rest)
    trainer = config.trainer
    strategy = _strategy_factory(trainer.strategy)
    # only what the step computes: no logger, callbacks or checkpoints; one process
    trainer.logger, trainer.callbacks, trainer.strategy = False, None, "auto"
    instantiate = getattr(fit_parser, "instantiate", None) or fit_parser.instantiate_classes
    built = instantiate(config)
    seed = config.seed_everything
    lightning_log = logging.getLogger("lightning.pytorch")
    level = lightning_log.level
    lightning_log.setLevel(logging.WARNING)  # the Trainer's banners, twice
    try:
        report = verify_step(
            built.model,
            built.data,
            strategy,
            accelerator=str(trainer.accelerator or "auto"),
            precision=trainer.precision,
            seed=seed if isinstance(seed, int) and not isinstance(seed, bool) else 0,  # True/False: 0
            tolerance=own.tolerance,
        )
    except VerifyError as exc:
        print(f"verify: cannot conclude: {exc}")
        return 2
    finally:
        lightning_log.setLevel(level)
    print("\n".join(report.lines()))
    return 0 if report.passed else 1


def main(args: list[str] | None = None) -> None:
    import thundersync_lightning  # noqa: F401  registers strategy="thundersync"

    argv = sys.argv[1:] if args is None else list(args)
    try:
        if argv[:1] == ["plan"]:
            raise SystemExit(plan_main(argv[1:]))
        if argv[:1] == ["verify"]:
            raise SystemExit(verify_main(argv[1:]))
        if argv[:1] == ["export"]:
            raise SystemExit(export_main(argv[1:]))
        ThunderSyncCLI(**_cli_kwargs(), args=args)
    except ConfigError as err:  # found at set-up: the message says what to change, a traceback adds nothing
        if wants_traceback():
            raise
        command = " ".join(["thundersync-lightning", *argv[:1]])
        print(short_config_error(command, err), file=sys.stderr)
        raise SystemExit(2) from None
    except RunFailed as err:  # the fit ran and summary.json is written: the reason, not a traceback
        if wants_traceback():
            raise
        print(f"thundersync-lightning: the run failed: {err}", file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
