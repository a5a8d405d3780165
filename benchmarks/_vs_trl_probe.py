"""The per-step probe of :mod:`vs_trl`'s project runs: a Lightning callback given by class path in
the fit's YAML. At every step's end it appends one JSON line to ``path``: the wall clock and the CPU
seconds of the whole process tree (learner, generation process, reward and tool workers) at that
moment, and the step's generated tokens, mean reward and the learner's busy time by kind (scoring
forward + backward, fold, barrier, optimizer, publish) from the strategy's ``last_step_stats``.
:mod:`_vs_trl_trl` writes the same lines from TRL's ``on_step_end``; step ``k``'s time is the
difference between lines ``k`` and ``k - 1`` in both, so both count everything between two steps.
"""

from __future__ import annotations

import json
import time
from typing import Any

import lightning.pytorch as pl

from _vs_trl_task import tree_cpu_seconds


class StepProbe(pl.Callback):
    def __init__(self, path: str) -> None:
        self.path = path
        self._file = open(path, "a")  # noqa: SIM115 - kept open for the fit, closed at its end

    def _write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write({"step": 0, "wall": time.monotonic(), "cpu": tree_cpu_seconds()})

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        stats = trainer.strategy.last_step_stats
        rewards = [t.reward if t.reward is not None else 0.0 for t in stats.trajectories]
        self._write(
            {
                "step": trainer.global_step,
                "wall": time.monotonic(),
                "cpu": tree_cpu_seconds(),
                "tokens": sum(t.num_scored_tokens for t in stats.trajectories),
                "completions": len(stats.trajectories),
                "reward": sum(rewards) / max(1, len(rewards)),
                "failures": sum(t.failure is not None for t in stats.trajectories),
                "tool_calls": sum(t.tool_calls for t in stats.trajectories),
                "step_seconds_inside": stats.wall_seconds,
                # the learner's own time: its work by kind, and the rest of the step (waiting)
                "learner_s": {
                    kind: sum(i.end - i.start for i in stats.busy if i.kind == kind)
                    for kind in ("backward", "fold", "barrier", "optimizer", "publish")
                },
                "learner_calls": sum(i.kind == "backward" for i in stats.busy),
                "backward_passes": stats.backward_passes,
                # the learner's call settings as resolved for the step ("auto"), where recorded
                **{
                    k: getattr(stats, k)
                    for k in ("max_batch_trajectories", "hold_after_s")
                    if hasattr(stats, k)
                },
                # which rule chose each call (batching.next_batch): direct (every reward of its
                # groups known: one whole backward), bucket (a partial group's reward sum), held
                # (reward pending)
                "learner_calls_by_path": {
                    path: sum(i.kind == "backward" and i.path == path for i in stats.busy)
                    for path in ("direct", "bucket", "held")
                },
            }
        )

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._file.close()
