"""A callback for the CLI fit test: writes every trajectory's staleness and the engine's publish times."""

from __future__ import annotations

import json

from lightning.pytorch import Callback


class StalenessProbe(Callback):
    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stats = trainer.strategy.last_step_stats
        engine = trainer.datamodule.engine
        self.rows.append(
            {
                "step": stats.step,
                "policy_version": stats.policy_version,
                "staleness": [t.staleness for t in stats.trajectories],
                "versions": [t.policy_version for t in stats.trajectories],
                "engine": type(engine).__name__,
                "engine_version": engine.version,
                "publish_seconds": engine.last_publish_seconds,
            }
        )
        with open(self.path, "w") as f:
            json.dump(self.rows, f)
