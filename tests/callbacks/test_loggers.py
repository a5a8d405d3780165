import os

import pytest

from thundersync_lightning.callbacks import ThunderSyncWandbLogger, default_wandb_logger
from thundersync_lightning.callbacks.loggers import resolve_wandb_mode


def test_the_mode_is_offline_unless_configured(monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    assert resolve_wandb_mode() == "offline"
    assert resolve_wandb_mode("online") == "online"
    monkeypatch.setenv("WANDB_SWEEP_ID", "abc")  # inside `wandb agent`: report to the sweep
    assert resolve_wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")  # the environment wins over the defaults
    assert resolve_wandb_mode() is None
    assert resolve_wandb_mode("offline") == "offline"


def test_building_the_logger_leaves_the_process_environment_alone(tmp_path, monkeypatch):
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_SWEEP_ID", raising=False)
    logger = default_wandb_logger(save_dir=str(tmp_path / "w"), project="p")
    assert isinstance(logger, ThunderSyncWandbLogger)
    assert logger.save_dir == str(tmp_path / "w")
    assert "WANDB_MODE" not in os.environ  # WandbLogger(offline=True) would have set it to dryrun


def test_offline_true_is_refused_with_the_fix():
    with pytest.raises(ValueError, match='mode="offline"'):
        ThunderSyncWandbLogger(offline=True)
