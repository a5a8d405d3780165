"""Run by test_strategy_ddp_and_resume as its own process: Lightning's popen launcher re-runs this file."""

from __future__ import annotations

import sys

import lightning as L
import torch

from thundersync_lightning.strategy import ThunderSyncStrategy

if __name__ == "__main__":
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    from tests.strategy._fit import TOY_MODEL, RecordSteps, flat, toy_data
    from thundersync_lightning.core import Objective
    from thundersync_lightning.modules import GRPOPolicy

    out, devices, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    objectives = {
        "default": Objective(),
        # every global quantity at once: token counts, the batch reward std, KL against the reference
        "global": Objective(loss_agg="token-mean", scale="batch", std="sample", kl_coef=0.05),
    }
    L.seed_everything(0)
    policy = GRPOPolicy(  # float64: one and two ranks sum in different orders, AdamW carries it on
        config=TOY_MODEL,
        objective=objectives[sys.argv[4] if len(sys.argv) > 4 else "default"],
        dtype="float64",
    )
    record = RecordSteps()
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode, boundary_cut=len(sys.argv) > 5 and sys.argv[5] == "cut"),
        accelerator="cpu",
        devices=devices,
        max_steps=3,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[record],
    )
    trainer.fit(policy, toy_data())
    if trainer.global_rank == 0:
        torch.save(
            {
                "params": flat(policy),
                "staleness": [t.staleness for s in record.steps for t in s.trajectories],
                "trajectories_per_step": [len(s.trajectories) for s in record.steps],
                "world_size": trainer.world_size,
            },
            out,
        )
