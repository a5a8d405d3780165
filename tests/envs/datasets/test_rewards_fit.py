"""A fit with TRL-signature rewards in each mode: a row every reward declines (unscorable), a row
whose prompt is null (fails at reset), a row that is scored; each is counted in the step's metrics
and summary.json, and the per-reward mean averages the trajectories where that reward gave a value.
The W&B run config holds the objective and every ``data.*`` setting."""

from __future__ import annotations

import json
import math
import warnings

import lightning as L
import pytest

import thundersync_lightning  # noqa: F401  registers strategy="thundersync"
from thundersync_lightning.callbacks import RolloutMetrics, RunSummary
from thundersync_lightning.envs.datasets import DatasetTasks
from thundersync_lightning.envs.toy import toy_model_spec
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig
from thundersync_lightning.strategy import ThunderSyncStrategy

PEER = "tests.envs.peer_rewards"
ROWS = [
    {"prompt": "2+3?", "answer": 5, "topic": "sums"},
    {"prompt": "Name a colour.", "answer": None, "topic": "open"},  # correctness declines, so does `declines`
    {"prompt": None, "answer": 1, "topic": "broken"},
]  # fails at reset: a DatasetRowError


def tiny_fit(mode: str, root, logger=False):  # noqa: ANN001, ANN201
    """One step: 3 groups (one per row) of 2 byte-level trajectories of at most 4 tokens, TRL's objective."""
    L.seed_everything(0)
    tasks = DatasetTasks(
        ROWS,
        reward=[f"{PEER}:correctness", f"{PEER}:declines"],
        reward_weights=[2.0, 1.0],
        max_action_tokens=4,
        val_fraction=0.0,
    )
    data = RolloutDataModule(
        tasks=tasks,
        engine=EmbeddedEngineConfig(num_threads=1, env_workers=2),
        group_size=2,
        groups_per_step=3,
    )
    metrics, summary = (
        RolloutMetrics(),
        RunSummary(print_summary=False, reward_curve=False, fail_empty_runs=False),
    )
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode),
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        callbacks=[metrics, summary],
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(GRPOPolicy(config={**toy_model_spec().config, "vocab_size": 259}, objective="trl"), data)
    return (
        metrics.last_metrics,
        json.loads((root / "summary.json").read_text()),
        [str(w.message) for w in caught],
    )


@pytest.mark.parametrize("mode", ["streaming", "sync", "async"])
def test_unscorable_and_failed_rows_are_counted_and_warned_in_a_fit(tmp_path, mode) -> None:
    from tests.callbacks.wandb_offline import finish_wandb, read_offline_run
    from thundersync_lightning.callbacks import ThunderSyncWandbLogger

    logger = ThunderSyncWandbLogger(save_dir=str(tmp_path), mode="offline", project="tests")
    try:
        metrics, summary, warned = tiny_fit(mode, tmp_path, logger)
    finally:
        finish_wandb()
    config = read_offline_run(tmp_path)["config"]
    assert (
        config["objective"]["estimator"] == "grpo" and config["objective"]["scale"] == "group"
    )  # TRL's preset
    data = config["data"]
    assert (data["group_size"], data["groups_per_step"]) == (2, 3)
    assert data["tasks"]["class_path"].endswith("DatasetTasks")
    assert data["tasks"]["init_args"]["reward_weights"] == [2.0, 1.0]
    assert data["tasks"]["init_args"]["reward"] == [f"{PEER}:correctness", f"{PEER}:declines"]
    assert data["tasks"]["init_args"]["path"] == ROWS  # in memory here; a file's path is its string
    assert data["engine"]["init_args"]["env_workers"] == 2
    assert metrics["rollout/trajectories_count"] == 6
    assert metrics["rollout/unscorable_fraction"] == 2 / 6  # the open row's two trajectories
    assert metrics["rollout/reward_error_fraction"] == 2 / 6  # the broken row's two
    assert summary["unscorable_fraction"] == 2 / 6 and summary["reward_error_fraction"] == 2 / 6
    assert "DatasetRowError: row 2 of" in summary["reward_error_first"]
    # correctness scored only the sums row's two trajectories: its mean is over those, in {0, 0.5, 1}
    assert metrics["rollout/reward/correctness_mean"] in (0.0, 0.5, 1.0)
    assert math.isnan(metrics["rollout/reward/declines_mean"])  # it never gave a value
    assert sum("a data row failed at reset" in w for w in warned) == 1
    assert sum("every reward returned None" in w for w in warned) == 1
