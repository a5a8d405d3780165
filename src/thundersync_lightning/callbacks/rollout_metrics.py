"""RolloutMetrics: what the step's trajectories achieved, reduced over every rank's trajectories.

Means are weighted by trajectory counts across ranks (torchmetrics ``MeanMetric`` states are
all-gathered by ``compute()``), so with ranks holding 3 and 1 trajectories the logged mean is the
mean of the 4, not the mean of two rank means.

=======================================  ==========================================================
``rollout/reward_mean``                  mean reward of the trajectories whose reward is known
``rollout/reward_std``                   its population standard deviation
``rollout/pass_rate``                    fraction with reward >= ``pass_threshold``
``rollout/trajectory_tokens_mean``       mean tokens per trajectory (prompt, actions, observations)
``rollout/scored_tokens_mean``           mean policy-generated (scored) tokens per trajectory
``rollout/turns_mean``                   mean turns per trajectory
``rollout/trajectories_count``           trajectories in the step
``rollout/failures_count``               trajectories with a failure (engine, environment, verdict)
``rollout/failure_rate``                 failures / trajectories
``rollout/invalid_tool_call_fraction``   malformed tool calls / tool calls (0 when none was made)
``rollout/finish_{reason}_count``        trajectories by finish reason (submit, turn_limit, length,
                                         failure)
``rollout/groups_folded_count``          groups folded into the gradient
``rollout/groups_aborted_count``         groups dropped
``train/loss``                           the step's GRPO surrogate -(1/N) sum A_i S_i (global; equal
                                         on every rank)
``train/zero_advantage_group_fraction``  groups whose rewards are all equal (every advantage 0: no
                                         gradient) / groups with rewards
=======================================  ==========================================================

When every group of ``zero_advantage_warn_steps`` consecutive steps had equal rewards (e.g. a
random model that never passes a test), a warning says that the run is not learning and why.
"""

from __future__ import annotations

import logging
import math

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from thundersync_lightning.callbacks._common import StepReducer, StepStatsCallback, log_step_metrics
from thundersync_lightning.strategy.stats import StepStats

__all__ = ["RolloutMetrics", "FINISH_REASONS"]

log = logging.getLogger(__name__)

FINISH_REASONS = ("submit", "turn_limit", "length", "failure")


class RolloutMetrics(StepStatsCallback):
    """Log the rollout keys of the module docstring at every step.

    Args:
        pass_threshold: a trajectory passes when its reward is >= this.
        zero_advantage_warn_steps: warn after this many consecutive steps in which every group had
            equal rewards (0: never).
    """

    def __init__(self, pass_threshold: float = 1.0, zero_advantage_warn_steps: int = 20) -> None:
        self.pass_threshold = pass_threshold
        self.zero_advantage_warn_steps = zero_advantage_warn_steps
        self._zero_streak = 0
        kinds = {
            "rollout/reward_mean": "mean",
            "reward_sq_mean": "mean",
            "rollout/pass_rate": "mean",
            "rollout/trajectory_tokens_mean": "mean",
            "rollout/scored_tokens_mean": "mean",
            "rollout/turns_mean": "mean",
            "rollout/trajectories_count": "sum",
            "rollout/failures_count": "sum",
            "rollout/groups_folded_count": "sum",
            "rollout/groups_aborted_count": "sum",
            "zero_advantage_groups": "sum",
            "rewarded_groups": "sum",
            "tool_calls": "sum",
            "invalid_tool_calls": "sum",
        }
        kinds.update({f"rollout/finish_{r}_count": "sum" for r in FINISH_REASONS})
        self._reducer = StepReducer(kinds)
        self._last: dict[str, float] = {}
        super().__init__()

    @property
    def metric_keys(self) -> list[str]:
        """Every key this monitor logs."""
        names = [n for n in self._reducer.names if n.startswith("rollout/")]
        return [
            *names,
            "rollout/reward_std",
            "rollout/failure_rate",
            "rollout/invalid_tool_call_fraction",
            "train/loss",
            "train/zero_advantage_group_fraction",
        ]

    @property
    def last_metrics(self) -> dict[str, float]:
        return dict(self._last)

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        self._reducer.to(pl_module.device)

    def update(self, stats: StepStats) -> None:
        """Add this rank's trajectories of one step (then :meth:`compute` on every rank)."""
        trajs = stats.trajectories
        rewards = [float(t.reward) for t in trajs if t.reward is not None]
        r = self._reducer
        r.update("rollout/reward_mean", rewards)
        r.update("reward_sq_mean", [x * x for x in rewards])
        r.update("rollout/pass_rate", [float(x >= self.pass_threshold) for x in rewards])
        r.update("rollout/trajectory_tokens_mean", [float(t.num_tokens) for t in trajs])
        r.update("rollout/scored_tokens_mean", [float(t.num_scored_tokens) for t in trajs])
        r.update("rollout/turns_mean", [float(t.num_turns) for t in trajs])
        r.update("rollout/trajectories_count", float(len(trajs)))
        r.update("rollout/failures_count", float(sum(t.failure is not None for t in trajs)))
        r.update("rollout/groups_folded_count", float(stats.groups_folded))
        r.update("rollout/groups_aborted_count", float(stats.groups_aborted))
        r.update("zero_advantage_groups", float(stats.zero_advantage_groups))
        r.update("rewarded_groups", float(len(stats.group_rewards)))
        r.update("tool_calls", float(sum(t.tool_calls for t in trajs)))
        r.update("invalid_tool_calls", float(sum(t.invalid_tool_calls for t in trajs)))
        for reason in FINISH_REASONS:
            r.update(f"rollout/finish_{reason}_count", float(sum(t.finish_reason == reason for t in trajs)))

    def compute(self) -> dict[str, float]:
        """Reduce over ranks (a collective) and reset; NaN where no trajectory had a reward."""
        out = self._reducer.compute()
        mean, sq = out["rollout/reward_mean"], out.pop("reward_sq_mean")
        out["rollout/reward_std"] = (
            math.sqrt(max(sq - mean * mean, 0.0)) if not math.isnan(mean) else math.nan
        )
        n = out["rollout/trajectories_count"]
        out["rollout/failure_rate"] = out["rollout/failures_count"] / n if n > 0 else 0.0
        zero, groups = out.pop("zero_advantage_groups"), out.pop("rewarded_groups")
        out["train/zero_advantage_group_fraction"] = zero / groups if groups > 0 else math.nan
        calls, invalid = out.pop("tool_calls"), out.pop("invalid_tool_calls")
        out["rollout/invalid_tool_call_fraction"] = invalid / calls if calls > 0 else 0.0
        return out

    @override
    def on_step_stats(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stats: StepStats) -> None:
        self.update(stats)
        self._last = {**self.compute(), "train/loss": stats.loss}
        log_step_metrics(pl_module, self._last)
        self._check_zero_advantage(self._last["train/zero_advantage_group_fraction"])

    def _check_zero_advantage(self, fraction: float) -> None:
        self._zero_streak = self._zero_streak + 1 if fraction == 1.0 else 0
        if self.zero_advantage_warn_steps and self._zero_streak == self.zero_advantage_warn_steps:
            rank_zero_warn(
                f"For {self._zero_streak} consecutive steps every group had equal rewards "
                "(train/zero_advantage_group_fraction = 1): all advantages are 0, the gradient is 0 and the "
                "policy does not change. The tasks are too hard (or too easy) for the current policy: use easier "
                "tasks, a stronger starting model, a larger group_size, or a reward with partial credit."
            )
