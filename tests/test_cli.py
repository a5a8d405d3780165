"""The ``thundersync-lightning`` command as a newcomer runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SUMMARY_KEYS = {
    "mode",
    "steps",
    "reward_mean_first",
    "reward_mean_last",
    "staleness_max",
    "learner_idle_fraction",
    "wall_seconds",
}


def _fit(root: Path, *extra: str) -> subprocess.CompletedProcess:
    cli = Path(sys.executable).with_name("thundersync-lightning")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [
            str(cli),
            "fit",
            "--config",
            str(ROOT / "configs" / "toy.yaml"),
            f"--trainer.default_root_dir={root}",
            "--data.groups_per_step=4",
            "--data.group_size=4",
            *extra,
        ],
        cwd=root.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


# sync also runs with a logger given without save_dir and the progress bar switched off: the
# logger writes into the run's directory and the config's RolloutProgressBar is left out
@pytest.mark.parametrize(
    "mode, extra",
    [
        ("sync", ("--trainer.logger=CSVLogger", "--trainer.enable_progress_bar=false")),
        pytest.param("async", (), marks=pytest.mark.slow),
    ],  # a second whole CLI fit (~15 s)
)
def test_fit_from_the_cli_writes_the_summary_and_the_last_checkpoint(tmp_path, mode, extra):
    root = tmp_path / "run"
    proc = _fit(root, "--trainer.max_steps=2", f"--trainer.strategy.init_args.mode={mode}", *extra)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if extra:
        (metrics,) = root.glob("lightning_logs/version_*/metrics.csv")
        assert "rollout/reward_mean" in metrics.read_text().splitlines()[0]
        assert not (root / "wandb").exists()
    else:
        assert (root / "trajectories.jsonl").is_file() and (root / "reward_curve.png").is_file()
        output = proc.stdout + proc.stderr  # third-party noise is filtered (core/third_party_noise.py)
        for noise in (
            "litlogger",
            "anonymous setting",
            "LeafSpec",
            "across ranks is zero",
            "Sanity Checking",
        ):
            assert noise not in output, noise
        assert [line.split()[:3] for line in proc.stdout.splitlines() if line.startswith("step ")] == [
            ["step", "0", "(1/2)"], ["step", "1", "(2/2)"],
        ]  # fmt: skip
    summary = json.loads((root / "summary.json").read_text())
    assert SUMMARY_KEYS <= set(summary)
    assert summary["mode"] == mode
    assert summary["steps"] == 2
    assert summary["staleness_max"] == (1 if mode == "async" else 0)
    assert 0.0 <= summary["learner_idle_fraction"] <= 1.0
    assert 0.0 <= summary["reward_mean_first"] <= 1.0
    assert (root / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.slow  # 50 s; resuming is also covered by tests/strategy/test_strategy_ddp_and_resume.py
def test_fit_resumes_from_the_last_checkpoint(tmp_path):
    root = tmp_path / "run"
    first = _fit(root, "--trainer.max_steps=1")
    assert first.returncode == 0, first.stderr[-4000:]
    resumed = _fit(root, "--trainer.max_steps=2", f"--ckpt_path={root / 'checkpoints' / 'last.ckpt'}")
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    summary = json.loads((root / "summary.json").read_text())
    assert (summary["steps"], summary["steps_this_fit"]) == (2, 1)  # the whole run, not only the resumed step
    assert summary["trajectories"] == 2 * 16
    runs = sorted((root / "wandb").glob("offline-run-*"))  # one folder per fit, one W&B run id
    assert len(runs) == 2 and len({p.name.rsplit("-", 1)[1] for p in runs}) == 1


def test_only_loggers_that_require_a_save_dir_get_the_run_directory():
    from thundersync_lightning.cli import RUN_DIR, with_logger_save_dir

    given = ["fit", "--trainer.logger", "CSVLogger", "--trainer.max_steps=1"]
    assert with_logger_save_dir(given) == [
        *given[:3],
        f"--trainer.logger.init_args.save_dir={RUN_DIR}",
        given[3],
    ]
    explicit = ["--trainer.logger=TensorBoardLogger", "--trainer.logger.save_dir=tb"]
    assert with_logger_save_dir(explicit) == explicit
    optional = [
        "--trainer.logger=thundersync_lightning.callbacks.ThunderSyncWandbLogger"
    ]  # save_dir has a default
    assert with_logger_save_dir(optional) == optional


def test_a_config_files_logger_without_save_dir_gets_the_run_directory(tmp_path):
    from thundersync_lightning.cli import RUN_DIR, with_logger_save_dir

    config = tmp_path / "csv.yaml"
    config.write_text("trainer:\n  logger:\n    class_path: lightning.pytorch.loggers.CSVLogger\n")
    given = ["fit", "--config", str(ROOT / "configs" / "toy.yaml"), "--config", str(config)]
    assert with_logger_save_dir(given) == [*given, f"--trainer.logger.init_args.save_dir={RUN_DIR}"]


@pytest.mark.slow  # two CLI runs
def test_validating_a_fits_checkpoint_from_the_cli_asks_for_no_callback_and_keeps_the_checkpoint_directory(
    tmp_path,
):
    root = tmp_path / "run"
    assert _fit(root, "--trainer.max_steps=1").returncode == 0
    cli = Path(sys.executable).with_name("thundersync-lightning")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(cli), "validate", "--config", str(ROOT / "configs" / "toy.yaml"),
         f"--trainer.default_root_dir={root}", "--data.val_samples=2",
         f"--ckpt_path={root / 'checkpoints' / 'last.ckpt'}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "val/pass_at_1" in proc.stdout
    assert (
        "Please add the following callbacks" not in proc.stderr and "dirpath has changed" not in proc.stderr
    )


def test_a_malformed_config_value_fails_before_training_with_the_key_named(tmp_path):
    proc = _fit(tmp_path / "run", "--trainer.strategy.init_args.mode=eventually")
    assert proc.returncode != 0
    assert "mode" in proc.stderr


def test_the_code_config_has_the_toy_configs_logging_monitors_and_checkpoints():
    from thundersync_lightning.cli import build_parser

    parser = build_parser()

    def trainer(name: str):
        config = parser.parse_args(["--config", str(ROOT / "configs" / name)]).trainer
        callbacks = [(c.class_path, dict(getattr(c, "init_args", None) or {})) for c in config.callbacks]
        return config.logger.class_path, config.log_every_n_steps, [c for c, _ in callbacks], callbacks

    toy, code = trainer("toy.yaml"), trainer("code_local.yaml")
    assert code[:3] == toy[:3]
    assert code[1] == 1 and "thundersync_lightning.callbacks.TrajectoryLogger" in code[2]
    checkpoint = dict(code[3])["lightning.pytorch.callbacks.ModelCheckpoint"]
    assert checkpoint["save_last"] is True


def test_every_config_logger_writes_into_the_run_directory_given_on_the_command_line(tmp_path):
    from thundersync_lightning.cli import ThunderSyncCLI, _cli_kwargs

    cli = ThunderSyncCLI(
        **_cli_kwargs(), run=False,
        args=["--config", str(ROOT / "configs" / "code_learn.yaml"),
              f"--trainer.default_root_dir={tmp_path}"],
    )  # fmt: skip
    assert [str(logger.save_dir) for logger in cli.trainer.loggers] == [str(tmp_path)] * 2
    for name in sorted(p.name for p in (ROOT / "configs").glob("*.yaml")):
        config = yaml.safe_load((ROOT / "configs" / name).read_text()) or {}
        assert (config.get("trainer") or {}).get("enable_model_summary") is False, (
            f"{name} prints a layer table"
        )
        loggers = (config.get("trainer") or {}).get("logger") or []
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            save_dir = (logger.get("init_args") or {}).get("save_dir") if isinstance(logger, dict) else None
            assert save_dir in (None, "<run directory>"), f"{name} hard-codes {save_dir!r}"


def test_a_config_without_a_progress_bar_gets_the_rollout_bar_not_lightnings_epoch_bar(tmp_path):
    from thundersync_lightning.callbacks import RolloutProgressBar
    from thundersync_lightning.cli import ThunderSyncCLI, _cli_kwargs

    config = yaml.safe_load((ROOT / "configs" / "toy.yaml").read_text())
    config["trainer"]["callbacks"] = ["thundersync_lightning.callbacks.StalenessMonitor"]
    (tmp_path / "bare.yaml").write_text(yaml.safe_dump(config))
    cli = ThunderSyncCLI(**_cli_kwargs(), run=False,
                         args=["--config", str(tmp_path / "bare.yaml"),
                               f"--trainer.default_root_dir={tmp_path}"])  # fmt: skip
    assert isinstance(cli.trainer.progress_bar_callback, RolloutProgressBar)


@pytest.mark.slow  # two CLI fits
def test_the_readme_command_stopped_by_ctrl_c_resumes_the_same_run_with_ckpt_path(tmp_path):
    """Ctrl-C in a terminal: SIGINT to the whole process group (learner and engine processes)."""
    import signal

    root = tmp_path / "run"
    cli = Path(sys.executable).with_name("thundersync-lightning")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    command = [str(cli), "fit", "--config", str(ROOT / "configs" / "toy.yaml"),
               f"--trainer.default_root_dir={root}", "--data.groups_per_step=4", "--data.group_size=4",
               "--trainer.max_steps=4"]  # fmt: skip
    first = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, start_new_session=True)  # fmt: skip
    assert first.stdout is not None
    for line in first.stdout:  # the progress bar's line for step 1 is printed after that step's barrier
        if line.startswith("step 1 "):
            os.killpg(first.pid, signal.SIGINT)
            break
    out, err = first.communicate(timeout=1200)
    assert first.returncode == 1, err[-3000:]
    stopped = json.loads((root / "summary.json").read_text())
    assert stopped["stopped_by"] == "KeyboardInterrupt" and stopped["steps"] >= 2
    import torch

    reached = torch.load(root / "checkpoints" / "last.ckpt", weights_only=False)["global_step"]
    assert reached == stopped["steps"]  # last.ckpt holds every step the summary counts

    resumed = subprocess.run([*command, f"--ckpt_path={root / 'checkpoints' / 'last.ckpt'}"], cwd=tmp_path,
                             env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = json.loads((root / "summary.json").read_text())
    assert (summary["steps"], summary["steps_this_fit"], summary["stopped_by"]) == (4, 4 - reached, None)
    logged = [json.loads(line)["step"] for line in (root / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(set(logged)) == [0, 1, 2, 3] and len(logged) == 4 * 4  # each step once, 4 trajectories each
    runs = sorted((root / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and len({p.name.rsplit("-", 1)[1] for p in runs}) == 1  # one W&B run
