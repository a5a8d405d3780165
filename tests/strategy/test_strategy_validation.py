"""Evaluation through Lightning's validation loop: pass@k, staleness-0 held-out rollouts, metrics,
``ValidateAtStart``, ``summary.json``'s val keys and ``thundersync-lightning validate --ckpt_path``."""

from __future__ import annotations

import csv
import glob
import itertools
import json
import os

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger

import thundersync_lightning  # noqa: F401  registers strategy="thundersync"
from thundersync_lightning.callbacks import RunSummary, ValidateAtStart
from thundersync_lightning.cli import ThunderSyncCLI, _cli_kwargs
from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.evaluation import ValidationOutcome, pass_at_k
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig
from thundersync_lightning.strategy import ThunderSyncStrategy

# Two secrets, two guesses: "guess 0, and 1 after HIGHER" always wins.
TASKS = GuessingGameTasks(num_digits=2, max_turns=2, latency="none")
MODEL = dict(TASKS.model_spec().config)


def brute_pass_at_k(n: int, c: int, k: int) -> float:
    """Fraction of the k-subsets of n samples (c passing) that contain a passing sample."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_equals_the_brute_force_count_over_every_k_subset() -> None:
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(brute_pass_at_k(n, c, k), abs=1e-12), (n, c, k)


def test_pass_at_k_rejects_k_above_n_and_impossible_counts() -> None:
    for n, c, k in ((4, 1, 5), (4, 5, 1), (4, -1, 1), (4, 1, 0)):
        with pytest.raises(ValueError):
            pass_at_k(n, c, k)


def test_outcome_metrics_average_pass_at_k_over_tasks() -> None:
    out = ValidationOutcome(
        samples=4,
        pass_k=2,
        passed=(0, 2, 4),
        rewards=(1.0,) * 6 + (0.0,) * 6,
        turns=(1,) * 6 + (3,) * 6,
        failures=1,
    )
    m = out.metrics()
    assert m["pass_at_1"] == pytest.approx((0 + 0.5 + 1) / 3)
    assert m["pass_at_k"] == pytest.approx((0 + (1 - 1 / 6) + 1) / 3)  # C(2,2)/C(4,2) = 1/6
    assert (
        m["reward_mean"] == 0.5 and m["turns_mean"] == 2.0 and m["failed_fraction"] == pytest.approx(1 / 12)
    )


def test_validation_needs_a_task_source_with_held_out_tasks() -> None:
    class NoSplit:
        max_turns, max_action_tokens, stop_token = 1, 1, None

        def tasks(self, step, num_groups, seed):  # noqa: ANN001, ANN201
            return []

        def make_env(self, task, seed):  # noqa: ANN001, ANN201
            raise AssertionError

    with pytest.raises(ConfigError, match="validation_tasks"):
        RolloutDataModule(tasks=NoSplit(), engine=EmbeddedEngineConfig(), val_samples=2)
    with pytest.raises(ConfigError, match="val_pass_k"):
        RolloutDataModule(tasks=TASKS, engine=EmbeddedEngineConfig(), val_samples=2, val_pass_k=3)


def always_right(policy: GRPOPolicy) -> GRPOPolicy:
    """Weights whose next token depends on the last token only, and wins the 2-secret game.

    Attention and MLP outputs are zeroed, so the last hidden state is the RMS-normalised one-hot
    embedding of the last token (8 e_t); the output head then maps START -> 0, HIGHER -> 1."""
    m = policy.model
    start, higher = 2 + 4, 2
    with torch.no_grad():
        emb = m.model.embed_tokens.weight
        emb.zero_()
        emb[:, : emb.shape[0]] = torch.eye(emb.shape[0])
        for layer in m.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        m.model.norm.weight.fill_(1.0)
        head = m.lm_head.weight
        head.fill_(-20.0)
        head[0, :] = 20.0
        head[0, higher], head[1, higher] = -20.0, 20.0
        del start  # START -> 0 is covered by row 0
    return policy


def data(**kwargs) -> RolloutDataModule:  # noqa: ANN003
    return RolloutDataModule(
        tasks=TASKS,
        engine=EmbeddedEngineConfig(num_threads=1, env_workers=4),
        group_size=4,
        groups_per_step=2,
        val_samples=8,
        val_pass_k=4,
        val_groups=1,
        **kwargs,
    )


def trainer(root: str, strategy=None, **kwargs) -> L.Trainer:  # noqa: ANN001, ANN003
    return L.Trainer(
        strategy=strategy or ThunderSyncStrategy(),
        accelerator="cpu",
        devices=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=root,
        **kwargs,
    )


def test_validate_gives_pass_at_1_one_for_winning_weights_and_less_untrained(tmp_path) -> None:  # noqa: ANN001
    L.seed_everything(0)
    untrained = trainer(str(tmp_path / "u"), logger=False).validate(GRPOPolicy(config=MODEL), data())[0]
    assert untrained["val/pass_at_1"] < 1.0
    assert untrained["val/pass_at_1"] == pytest.approx(untrained["val/reward_mean"])  # 0/1 rewards
    assert untrained["val/pass_at_1"] <= untrained["val/pass_at_k"]

    # Under a stock strategy GRPOPolicy.validation_step runs the rollouts itself.
    winner = always_right(GRPOPolicy(config=MODEL))
    stock = trainer(str(tmp_path / "w"), strategy="auto", logger=False)
    won = stock.validate(winner, data())[0]
    assert won == {
        "val/pass_at_1": 1.0,
        "val/pass_at_k": 1.0,
        "val/reward_mean": 1.0,
        "val/turns_mean": pytest.approx(1.5),
        "val/failed_fraction": 0.0,
    }

    # `thundersync-lightning validate --ckpt_path` evaluates the checkpoint alone, with strategy=thundersync.
    ckpt = str(tmp_path / "winner.ckpt")
    stock.save_checkpoint(ckpt)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        json.dumps(
            {
                "trainer": {
                    "accelerator": "cpu",
                    "devices": 1,
                    "logger": False,
                    "enable_progress_bar": False,
                    "default_root_dir": str(tmp_path / "cli"),
                    # a class_path: LightningCLI then passes every DDP option at its default through **kwargs
                    "strategy": {
                        "class_path": "thundersync_lightning.strategy.ThunderSyncStrategy",
                        "init_args": {"mode": "streaming"},
                    },
                },
                "model": {"config": MODEL},
                "data": {
                    "tasks": {
                        "class_path": "thundersync_lightning.envs.toy.GuessingGameTasks",
                        "init_args": {"num_digits": 2, "max_turns": 2, "latency": "none"},
                    },
                    "engine": {
                        "class_path": "thundersync_lightning.rollout.EmbeddedEngineConfig",
                        "init_args": {"num_threads": 1, "env_workers": 4},
                    },
                    "group_size": 4,
                    "groups_per_step": 2,
                    "val_samples": 8,
                    "val_groups": 1,
                },
            }
        )
    )
    cli = ThunderSyncCLI(**_cli_kwargs(), args=["validate", "--config", str(cfg), "--ckpt_path", ckpt])
    assert cli.trainer.callback_metrics["val/pass_at_1"].item() == 1.0


def test_fit_validates_at_start_and_every_interval_and_summarises_first_and_last(tmp_path) -> None:  # noqa: ANN001
    L.seed_everything(0)
    root = str(tmp_path)
    t = trainer(
        root,
        max_steps=4,
        val_check_interval=2,
        logger=CSVLogger(root, name="csv"),
        callbacks=[ValidateAtStart(), RunSummary()],
    )
    t.fit(GRPOPolicy(config=MODEL), data())
    with open(glob.glob(os.path.join(root, "csv", "**", "metrics.csv"), recursive=True)[0]) as f:
        rows = [r for r in csv.DictReader(f) if r.get("val/pass_at_1")]
    assert len(rows) == 3  # before step 0, after step 2, after step 4
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["staleness_max"] == 0
    assert summary["val_pass_at_1_first"] == pytest.approx(float(rows[0]["val/pass_at_1"]))
    assert summary["val_pass_at_1_last"] == pytest.approx(float(rows[-1]["val/pass_at_1"]))
