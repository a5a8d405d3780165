"""IdleTimeMonitor: how long the learner waited for rollout events, and a drawable timeline.

Per step (``StepStats``): the learner is busy during its intervals (backward, barrier, optimizer,
publish) and idle otherwise. Logged, over ranks:

=========================================  ==================================================  =========
``perf/step_seconds``                      step wall time                                      max
``perf/learner_busy_seconds``              sum of busy intervals                               mean
``perf/learner_idle_seconds``              wall - busy                                         mean
``perf/learner_idle_fraction``             sum_r idle_r / sum_r wall_r                         ratio
``perf/learner_{kind}_seconds``            busy time by kind (backward/barrier/optimizer/      mean
                                           publish)
``perf/time_to_first_event_seconds``       rollout request -> first trajectory content (the    mean
                                           request precedes step start with launch_ahead)
``perf/tail_after_last_event_seconds``     last content or reward -> step end                  mean
``perf/learner_calls``                     learner calls (one scoring call and its backward)   mean
``perf/learner_call_tokens``               tokens per call (what ``max_batch_tokens`` caps)    mean
``perf/learner_call_tokens_max``           the largest call's tokens                           max
``perf/learner_call_wait_rows``            rows a call waited for while content was to land    mean
                                           (``min_batch_trajectories``; resolved under auto)
=========================================  ==================================================  =========

Each rank also writes one JSON line per step to ``<dirpath>/timeline/rank<r>.jsonl`` (``dirpath``
defaults to ``trainer.log_dir``; a fit starting at step 0 replaces the file, a resumed one appends): times in
seconds relative to the step start, busy intervals, content and reward arrivals per trajectory and open groups
over time (a backward interval also carries its call's ``trajectories``, ``tokens`` and ``path``).
:func:`read_timeline` loads it and :func:`draw_timeline` draws it with matplotlib.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from typing_extensions import override

from thundersync_lightning.callbacks.base import Max, Mean, Reduction, StepStatsCallback, Sum
from thundersync_lightning.strategy.stats import StepStats

__all__ = ["IdleTimeMonitor", "timeline_record", "read_timeline", "draw_timeline"]

log = logging.getLogger(__name__)

BUSY_KINDS = ("backward", "barrier", "optimizer", "publish")


def timeline_record(stats: StepStats) -> dict[str, Any]:
    """One step as plain JSON data, times relative to ``stats.step_start`` (seconds)."""
    t0 = stats.step_start

    def rel(t: float) -> float:
        return round(t - t0, 9)

    return {
        "step": stats.step,
        "rank": stats.rank,
        "mode": stats.mode,
        "policy_version": stats.policy_version,
        "step_start": t0,
        "wall_seconds": stats.wall_seconds,
        "idle_fraction": stats.idle_fraction,
        "busy": [_interval(i, rel) for i in stats.busy],
        "trajectories": [
            {
                "id": t.trajectory_id,
                "group": t.group_id,
                "content_ready": rel(t.content_ready_at),
                "reward_ready": None if t.reward_ready_at is None else rel(t.reward_ready_at),
                "num_tokens": t.num_tokens,
            }
            for t in stats.trajectories
        ],
        "open_groups": [[rel(t), n] for t, n in stats.open_groups],
    }


def _interval(i: Any, rel: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"start": rel(i.start), "end": rel(i.end), "kind": i.kind}
    if i.kind == "backward":
        out.update(trajectories=i.trajectories, tokens=i.tokens, path=i.path)
    return out


def read_timeline(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def draw_timeline(records: list[dict[str, Any]], ax: Any = None) -> Any:
    """Draw steps side by side: busy intervals as bars (one row per kind), content (|) and reward
    (x) arrivals as ticks. Returns the matplotlib axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(12, 3))
    offset = 0.0
    rows = {kind: i for i, kind in enumerate(BUSY_KINDS)}
    for rec in records:
        for b in rec["busy"]:
            row = rows.setdefault(b["kind"], len(rows))
            ax.broken_barh([(offset + b["start"], b["end"] - b["start"])], (row - 0.4, 0.8))
        events = len(rows)
        for t in rec["trajectories"]:
            ax.plot(offset + t["content_ready"], events, "|", color="tab:green")
            if t["reward_ready"] is not None:
                ax.plot(offset + t["reward_ready"], events + 1, "x", color="tab:orange", markersize=3)
        ax.axvline(offset + rec["wall_seconds"], color="grey", linewidth=0.5)
        offset += rec["wall_seconds"]
    labels = [*rows, "content", "reward"]
    ax.set_yticks(range(len(labels)), labels)
    ax.set_xlabel("seconds")
    return ax


class IdleTimeMonitor(StepStatsCallback):
    """Log the idle-time keys of the module docstring and write the per-step timeline.

    Args:
        dirpath: where ``timeline/rank<r>.jsonl`` goes; ``None``: ``trainer.log_dir``.
        write_timeline: set False to log the scalars only.
    """

    def __init__(self, dirpath: str | None = None, write_timeline: bool = True) -> None:
        self.dirpath = dirpath
        self.write_timeline = write_timeline
        self._path: Path | None = None
        self._first_write = True
        super().__init__()

    @property
    def timeline_path(self) -> Path | None:
        """This rank's timeline file (after ``setup``)."""
        return self._path

    @property
    def metric_keys(self) -> list[str]:
        """Every key this monitor logs."""
        return [
            "perf/step_seconds",
            "perf/learner_busy_seconds",
            "perf/learner_idle_seconds",
            "perf/time_to_first_event_seconds",
            "perf/tail_after_last_event_seconds",
            "perf/learner_calls",
            "perf/learner_call_tokens",
            "perf/learner_call_tokens_max",
            "perf/learner_call_wait_rows",
            *(f"perf/learner_{k}_seconds" for k in BUSY_KINDS),
            "perf/learner_idle_fraction",
        ]

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.write_timeline:
            root = self.dirpath if self.dirpath is not None else trainer.log_dir  # all ranks call it
            root = root if root is not None else trainer.default_root_dir
            self._path = Path(root) / "timeline" / f"rank{trainer.global_rank}.jsonl"
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._first_write = True

    @override
    def measure(self, stats: StepStats) -> dict[str, Reduction]:
        calls = [float(i.tokens) for i in stats.busy if i.kind == "backward"]
        return {
            "perf/step_seconds": Max(stats.wall_seconds),
            "perf/learner_busy_seconds": Mean(stats.busy_seconds),
            "perf/learner_idle_seconds": Mean(stats.idle_seconds),
            "idle_sum": Sum(stats.idle_seconds),
            "wall_sum": Sum(stats.wall_seconds),
            "perf/time_to_first_event_seconds": Mean(stats.first_event_delay),
            "perf/tail_after_last_event_seconds": Mean(stats.tail_seconds),
            **{
                f"perf/learner_{kind}_seconds": Mean(sum(i.seconds for i in stats.busy if i.kind == kind))
                for kind in BUSY_KINDS
            },
            "perf/learner_calls": Mean(len(calls)),
            # weighted by calls over ranks; a rank without calls adds nothing
            "perf/learner_call_tokens": Mean(calls) if calls else Mean(0.0, weight=0.0),
            "perf/learner_call_tokens_max": Max(calls),
            "perf/learner_call_wait_rows": Mean(stats.min_batch_trajectories),
        }

    @override
    def derive(self, reduced: dict[str, float], stats: StepStats) -> dict[str, float]:
        out = super().derive(reduced, stats)
        idle_sum, wall_sum = reduced["idle_sum"], reduced["wall_sum"]
        out["perf/learner_idle_fraction"] = idle_sum / wall_sum if wall_sum > 0 else 0.0
        return out

    @override
    def after_metrics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, stats: StepStats, metrics: dict[str, float]
    ) -> None:
        if self._path is not None:
            # a run that starts at step 0 replaces an old file; a resumed one appends to it
            mode = "w" if self._first_write and stats.step == 0 else "a"
            self._first_write = False
            with open(self._path, mode, encoding="utf-8") as f:
                f.write(json.dumps(timeline_record(stats)) + "\n")
