"""A real fit whose engine process is SIGKILLed between steps finishes every step.

The restart happens on the strategy's event-pump thread, which ends with its step; the new
process must outlive that thread (a child started from it would receive PR_SET_PDEATHSIG's
SIGKILL when it exits), so the steps after the restart are the real check.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import lightning as L
import pytest
from lightning.pytorch import Callback

from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig
from thundersync_lightning.strategy import ThunderSyncStrategy

from ..procs import gone, wait_until

pytestmark = pytest.mark.timeout(240)


class KillEngineAfterStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step
        self.killed: int | None = None
        self.trajectories: list[int] = []
        self.pids: list[int | None] = []

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.trajectories.append(len(trainer.strategy.last_step_stats.trajectories))
        engine = trainer.datamodule.engine
        self.pids.append(engine.pid)
        if trainer.global_step == self.step:
            self.killed = engine.pid
            os.kill(engine.pid, signal.SIGKILL)
            assert wait_until(lambda: gone(self.killed), 10.0)


def test_a_fit_whose_engine_is_killed_between_steps_completes_every_step(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    kill = KillEngineAfterStep(step=1)
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=EmbeddedEngineConfig(env_workers=4, max_engine_restarts=1),
        group_size=4,
        groups_per_step=4,
    )
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode="streaming"),
        accelerator="cpu",
        devices=1,
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(tmp_path),
        callbacks=[kill],
    )
    trainer.fit(GRPOPolicy(config=dict(toy_model_spec().config)), data)

    assert trainer.global_step == 4
    assert kill.trajectories == [16, 16, 16, 16]
    assert kill.pids[0] == kill.killed and len(set(kill.pids[1:])) == 1 and kill.pids[1] != kill.killed
