"""StalenessMonitor: how many policy versions behind the trained weights each trajectory was.

The staleness of a trajectory is ``trained version - policy_version`` (``TrajectoryRecord``). In
``streaming`` and ``sync`` modes it is 0 by construction; a stale trajectory there means the
gradient silently mixed an older policy's samples into an on-policy update, so by default the
monitor raises :class:`~thundersync_lightning.core.errors.StalenessError`. ``async`` mode is one
step off-policy on purpose (staleness 1): the monitor only records it.

Staleness 0 is a statement about version numbers; the monitor also checks the distributions: per
step it logs ``train/logprob_diff_mean`` and ``train/logprob_diff_max`` (|logp_engine -
logp_learner| over scored tokens) and ``train/engine_learner_kl`` (the k3 estimate of KL(engine ||
learner)), all from the forward the learner already runs and reduced over ranks by the strategy.
With ``require_zero`` a KL above ``kl_tolerance`` fails the step too (a temperature, top-p, dtype
or weight-sync mismatch the version numbers cannot show).

.. warning:: Statistics exist once the step's optimizer update is done, so the error is raised at
   the end of the step that used the stale trajectory, before Lightning's ``ModelCheckpoint``
   (which runs after the other callbacks) can save its weights. Every rank reduces the counts
   first and raises together, so no rank is left waiting in a collective.
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl
from typing_extensions import override

from thundersync_lightning.callbacks.base import Max, Mean, Reduction, StepStatsCallback, Sum
from thundersync_lightning.core.errors import StalenessError
from thundersync_lightning.strategy.stats import StepStats, TrajectoryRecord

__all__ = ["StalenessMonitor"]

ON_POLICY_KEYS = {
    "train/logprob_diff_mean": "logprob_diff_mean",
    "train/logprob_diff_max": "logprob_diff_max",
    "train/engine_learner_kl": "engine_learner_kl",
}

log = logging.getLogger(__name__)

_ZERO_STALENESS_MODES = frozenset({"streaming", "sync"})


class StalenessMonitor(StepStatsCallback):
    """Log per-step staleness (mean, max, histogram) and optionally require it to be zero.

    Keys (reduced over all ranks' trajectories): ``train/staleness_mean_versions``,
    ``train/staleness_max_versions``, ``train/stale_trajectories_count`` and the histogram
    ``train/staleness_{k}_versions_count`` for ``k < max_bucket`` plus
    ``train/staleness_{max_bucket}plus_versions_count``.

    Args:
        require_zero: raise at the first stale trajectory; ``None`` means True in ``streaming``
            and ``sync`` modes and False in ``async`` (read from each step's ``StepStats.mode``).
        max_bucket: the last histogram bucket, which collects every staleness >= it.
        kl_tolerance: with ``require_zero``, the largest per-token KL(engine || learner) accepted
            (float noise between two implementations of one distribution is ~1e-7 or below).
    """

    def __init__(
        self, require_zero: bool | None = None, max_bucket: int = 2, kl_tolerance: float = 1e-3
    ) -> None:
        if max_bucket < 1:
            raise ValueError(f"max_bucket must be >= 1, got {max_bucket}")
        if not kl_tolerance >= 0:
            raise ValueError(f"kl_tolerance must be >= 0, got {kl_tolerance}")
        self.kl_tolerance = kl_tolerance
        self.require_zero = require_zero
        self.max_bucket = max_bucket
        super().__init__()

    @property
    def histogram_keys(self) -> list[str]:
        keys = [f"train/staleness_{k}_versions_count" for k in range(self.max_bucket)]
        return [*keys, f"train/staleness_{self.max_bucket}plus_versions_count"]

    @property
    def metric_keys(self) -> list[str]:
        """Every key this monitor logs."""
        return [
            "train/staleness_mean_versions",
            "train/staleness_max_versions",
            "train/stale_trajectories_count",
            *self.histogram_keys,
            *ON_POLICY_KEYS,
        ]

    def requires_zero(self, mode: str) -> bool:
        if self.require_zero is not None:
            return self.require_zero
        return mode in _ZERO_STALENESS_MODES

    @override
    def measure(self, stats: StepStats) -> dict[str, Reduction]:
        values = [float(t.staleness) for t in stats.trajectories]
        counts = [0.0] * (self.max_bucket + 1)
        for v in values:
            counts[min(max(int(v), 0), self.max_bucket)] += 1
        return {
            "train/staleness_mean_versions": Mean(values),
            "train/staleness_max_versions": Max(values),
            "train/stale_trajectories_count": Sum(float(sum(v != 0 for v in values))),
            **{key: Sum(count) for key, count in zip(self.histogram_keys, counts)},
        }

    @override
    def derive(self, reduced: dict[str, float], stats: StepStats) -> dict[str, float]:
        # the on-policy distances are already reduced over ranks by the strategy
        on_policy = {key: getattr(stats, attr) for key, attr in ON_POLICY_KEYS.items()}
        return {**reduced, **{k: float(v) for k, v in on_policy.items() if v is not None}}

    @override
    def after_metrics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, stats: StepStats, metrics: dict[str, float]
    ) -> None:
        # every rank reduced the counts before any raises, so all ranks raise together (no rank is
        # left waiting in a collective for one that stopped)
        if self.requires_zero(stats.mode) and metrics["train/stale_trajectories_count"] > 0:
            raise StalenessError(self._message(stats))
        kl = stats.engine_learner_kl
        if self.requires_zero(stats.mode) and kl is not None and kl > self.kl_tolerance:
            raise StalenessError(
                f"step {stats.step}: the engine sampled from another distribution than the learner scores: "
                f"KL(engine || learner) = {kl:.3e} per token (max |logp difference| "
                f"{stats.logprob_diff_max:.3e}) > kl_tolerance={self.kl_tolerance}. The update is not the "
                "on-policy gradient. Check that the engine's temperature/top_p/top_k and dtype match the "
                "policy and that weights reach the engine, or raise kl_tolerance / use "
                "StalenessMonitor(require_zero=False) with the objective's importance correction."
            )

    def _message(self, stats: StepStats) -> str:
        first: TrajectoryRecord | None = min(
            (t for t in stats.trajectories if t.staleness != 0),
            key=lambda t: t.content_ready_at,
            default=None,
        )
        where = (
            f"trajectory {first.trajectory_id} (group {first.group_id}) was generated by policy "
            f"version {first.policy_version}, but step {stats.step} updates version "
            f"{stats.policy_version} (staleness {first.staleness})"
            if first is not None
            else f"rank {stats.rank} saw none, another rank did (see its error)"
        )
        return (
            f"Stale trajectory in {stats.mode!r} mode at step {stats.step}: {where}; "
            f"{int(self._last['train/stale_trajectories_count'])} stale trajectories over all ranks. "
            "The update would have silently mixed an older policy's samples into an on-policy "
            "gradient. Generation for a step must start only after the previous step's weights are "
            "published (mind Lightning's one-batch prefetch and DataLoader workers). To only record "
            "staleness, pass StalenessMonitor(require_zero=False) (the default in 'async' mode)."
        )
