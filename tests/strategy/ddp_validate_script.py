"""Run by test_strategy_ddp_and_resume as its own process: ``trainer.validate`` on 1 or 2 gloo ranks."""

from __future__ import annotations

import sys

import lightning as L
import torch

from thundersync_lightning.strategy import ThunderSyncStrategy

if __name__ == "__main__":
    from thundersync_lightning.envs.toy import GuessingGameTasks
    from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
    from thundersync_lightning.rollout import EmbeddedEngineConfig

    out, devices = sys.argv[1], int(sys.argv[2])
    # 3 held-out tasks in batches of 2 and 1: on 2 ranks the second batch leaves rank 1 without a task
    tasks = GuessingGameTasks(num_digits=3, max_turns=2, latency="none")
    data = RolloutDataModule(
        tasks=tasks,
        engine=EmbeddedEngineConfig(num_threads=1, env_workers=2),
        group_size=2,
        groups_per_step=2,
        val_samples=4,
        val_pass_k=2,
        val_groups=2,
    )
    L.seed_everything(0)
    policy = GRPOPolicy(config=dict(tasks.model_spec().config))
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(),
        accelerator="cpu",
        devices=devices,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    metrics = trainer.validate(policy, datamodule=data, verbose=False)[0]
    if trainer.global_rank == 0:
        torch.save({"metrics": metrics, "world_size": trainer.world_size}, out)
