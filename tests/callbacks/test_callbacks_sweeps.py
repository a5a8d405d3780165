"""Every configs/sweeps/*.yaml is a W&B sweep whose runs parse with the CLI and log its metric."""

import importlib
import itertools
from pathlib import Path

import pytest
from wandb.sdk.launch.sweeps import utils as sweep_utils

from thundersync_lightning.callbacks import (
    IdleTimeMonitor,
    MemoryMonitor,
    MFUMonitor,
    RolloutMetrics,
    StalenessMonitor,
)

ROOT = Path(__file__).resolve().parents[2]
SWEEPS = sorted((ROOT / "configs" / "sweeps").glob("*.yaml"))
MONITORS = [StalenessMonitor, MFUMonitor, MemoryMonitor, IdleTimeMonitor, RolloutMetrics]


def logged_by(key: str) -> list[type]:
    return [cls for cls in MONITORS if key in cls().metric_keys]


def runs(sweep: dict) -> list[dict]:
    """Every grid point (values crossed, single values fixed), as the agent's ``command["args"]``."""
    params = sweep["parameters"]
    names = sorted(params)
    choices = [params[n]["values"] if "values" in params[n] else [params[n]["value"]] for n in names]
    return [{n: {"value": v} for n, v in zip(names, combo)} for combo in itertools.product(*choices)]


def agent_argv(sweep: dict, args: dict, monkeypatch) -> list[str]:
    """The argv the agent would run (wandb_agent.Agent._command_run), macros expanded."""
    monkeypatch.setenv("WANDB_RUN_ID", "run123")
    command = sweep_utils.create_sweep_command(list(sweep["command"]))
    variables = sweep_utils.create_sweep_command_args({"args": args})
    variables["program"] = [sweep["program"]]
    argv: list[str] = []
    for chunk in map(str, command):
        argv += variables.get(chunk[2:-1], []) if chunk.startswith("${") and chunk.endswith("}") else [chunk]
    return argv


@pytest.fixture(scope="module")
def parser():
    cli = pytest.importorskip("thundersync_lightning.cli")
    p = cli.build_parser()
    p.exit_on_error = False
    return p


def test_there_are_sweeps():
    assert {p.stem for p in SWEEPS} >= {"lr", "group_size", "mode"}


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_each_sweep_is_a_grid_over_the_cli_optimising_a_logged_metric(path):
    sweep = sweep_utils.load_sweep_config(str(path))  # what `wandb sweep` reads
    assert sweep["method"] in {"grid", "random", "bayes"}
    assert sweep["metric"]["goal"] in {"minimize", "maximize"}
    assert logged_by(sweep["metric"]["name"]), f"no monitor logs {sweep['metric']['name']!r}"
    assert sweep["program"] == "thundersync-lightning"
    scripts = (ROOT / "pyproject.toml").read_text()
    assert 'thundersync-lightning = "thundersync_lightning.cli:main"' in scripts
    assert sweep["command"][:4] == ["${program}", "fit", "--config", "configs/toy.yaml"]
    assert sweep["command"][-1] == "${args}"


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: p.stem)
def test_every_run_of_a_sweep_parses_with_the_cli_and_sets_its_parameters(path, parser, monkeypatch):
    sweep = sweep_utils.load_sweep_config(str(path))
    monkeypatch.chdir(ROOT)
    for args in runs(sweep):
        argv = agent_argv(sweep, args, monkeypatch)
        assert argv[:2] == ["thundersync-lightning", "fit"]
        assert "--trainer.default_root_dir=runs/sweeps/run123" in argv
        ns = parser.parse_args(argv[2:])
        for key, spec in args.items():
            assert ns[key] == spec["value"], key


def _resolve(class_path: str) -> type:
    module, name = class_path.rsplit(".", 1)
    return getattr(importlib.import_module(module), name)


def test_the_config_the_sweeps_run_logs_their_metrics_to_w_and_b(parser, monkeypatch):
    """configs/toy.yaml must hold the W&B logger and the monitors (docs/metrics.md shows the lines);
    otherwise a sweep optimises a metric no run reports."""
    from lightning.pytorch.loggers import WandbLogger

    monkeypatch.chdir(ROOT)
    ns = parser.parse_args(["--config", "configs/toy.yaml"])
    logger = ns.trainer.logger
    loggers = [_resolve(lg.class_path) for lg in (logger if isinstance(logger, list) else [logger]) if lg]
    assert any(issubclass(cls, WandbLogger) for cls in loggers), (
        f"no W&B logger in configs/toy.yaml: {loggers}"
    )
    callbacks = [_resolve(cb.class_path) for cb in ns.trainer.callbacks or []]
    for path in SWEEPS:
        metric = sweep_utils.load_sweep_config(str(path))["metric"]["name"]
        owners = logged_by(metric)
        assert any(issubclass(cb, tuple(owners)) for cb in callbacks), (
            f"{path.name} optimises {metric}, logged by {[o.__name__ for o in owners]}: none is in "
            "configs/toy.yaml's trainer.callbacks"
        )
