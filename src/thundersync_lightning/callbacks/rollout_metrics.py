"""RolloutMetrics: what the step's trajectories achieved, reduced over every rank's trajectories.

Means are weighted by trajectory counts across ranks (torchmetrics ``MeanMetric`` states are
all-gathered by ``compute()``), so with ranks holding 3 and 1 trajectories the logged mean is the
mean of the 4, not the mean of two rank means.

=======================================  ==========================================================
``rollout/reward_mean``                  mean reward of the trajectories whose reward is known (not
                                         the unscorable ones)
``rollout/reward_std``                   its population standard deviation
``rollout/pass_rate``                    fraction with reward >= ``pass_threshold``
``rollout/trajectory_tokens_mean``       mean tokens per trajectory (prompt, actions, observations)
``rollout/scored_tokens_mean``           mean policy-generated (scored) tokens per trajectory
``rollout/turns_mean``                   mean turns per trajectory
``rollout/trajectories_count``           trajectories in the step
``rollout/failures_count``               trajectories with a failure (engine, environment, verdict)
``rollout/failure_rate``                 failures / trajectories
``rollout/host_faults_count``            failures no action caused (a failed reset, a sandbox host or
                                         process that went away: ``HostFault``); included in failures
``rollout/reward_error_fraction``        trajectories whose reward could not be computed (the verdict or
                                         a reward function raised, timed out or returned no finite
                                         number, or the task's data row could not be an episode, or
                                         a reward beyond ``max_abs_reward``: it scores the failure
                                         floor) / trajectories
``rollout/unscorable_fraction``          trajectories every reward declined (returned None, TRL's
                                         unscorable: no reward, advantage 0) / trajectories
``rollout/invalid_tool_call_fraction``   invalid calls / calls (a code task's text action is one call;
                                         0 when none was made)
``rollout/truncated_action_fraction``    actions that reached ``max_action_tokens`` without the stop
                                         (end-of-turn) token / actions (turns); 1 minus it is the
                                         fraction of actions that ended their turn
``rollout/tool_error_fraction``          tool calls whose tool raised or whose process died / tool calls
``rollout/tool_timeout_fraction``        tool calls whose tool overran its deadline (stopped) / tool calls
``rollout/reward/{name}_mean``           each named reward of a weighted sum, unweighted (TRL's
                                         ``reward_funcs``; names from the task source's ``reward_names``),
                                         over the trajectories where that reward gave a value (TRL's
                                         ``nanmean``: a failure of another reward does not hide it)
``rollout/finish_{reason}_count``        trajectories by finish reason (submit, turn_limit, length,
                                         failure)
``rollout/groups_folded_count``          groups folded into the gradient
``rollout/groups_aborted_count``         groups dropped
``rollout/groups_generated_count``       groups requested, dynamic-sampling replacements included
``rollout/groups_kept_count``            groups trained on (folded); with dynamic sampling the
                                         informative ones
``rollout/groups_dropped_count``         dynamic sampling: groups without signal, counted nowhere
``train/loss``                           the step's GRPO surrogate -(1/N) sum A_i S_i (global; equal
                                         on every rank)
``train/zero_advantage_group_fraction``  groups whose rewards are all equal (every advantage 0: no
                                         gradient) / groups with rewards
=======================================  ==========================================================

When every group of ``zero_advantage_warn_steps`` consecutive steps had equal rewards (e.g. a
random model that never passes a test), a warning says that the run is not learning and why. The
first step whose ``rollout/reward_error_fraction`` exceeds ``reward_error_warn_fraction`` warns
with the first error's message (a reward function with the wrong signature fails every trajectory
with reward 0, which looks like a task that is too hard). The first data row that fails at reset,
and the first unscorable trajectory, warn once each whatever their share. The first step with a tool that
raised, and the first with a tool that overran its deadline, warn once each with the first reason.
"""

from __future__ import annotations

import logging
import math

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_warn
from typing_extensions import override

from thundersync_lightning.callbacks.base import Mean, Reduction, StepStatsCallback, Sum
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
        reward_error_warn_fraction: warn (once) at the first step in which more than this
            share of the trajectories had a reward error (1.0: never).
    """

    def __init__(
        self,
        pass_threshold: float = 1.0,
        zero_advantage_warn_steps: int = 20,
        reward_error_warn_fraction: float = 0.1,
    ) -> None:
        if not 0.0 <= reward_error_warn_fraction <= 1.0:
            raise ValueError(
                f"reward_error_warn_fraction must be in [0, 1], got {reward_error_warn_fraction}"
            )
        self.pass_threshold = pass_threshold
        self.zero_advantage_warn_steps = zero_advantage_warn_steps
        self.reward_error_warn_fraction = reward_error_warn_fraction
        self._zero_streak = 0
        self._reward_error_warned = False
        self._row_error_warned = False
        self._unscorable_warned = False
        self._tool_warned: set[str] = set()
        self.reward_names: tuple[str, ...] = ()
        super().__init__()

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        tasks = getattr(getattr(trainer, "datamodule", None), "tasks", None)
        self.reward_names = tuple(getattr(tasks, "reward_names", ()) or ())

    @property
    def metric_keys(self) -> list[str]:
        """Every key this monitor logs."""
        counts = [
            "trajectories",
            "failures",
            "host_faults",
            "groups_folded",
            "groups_aborted",
            "groups_generated",
            "groups_kept",
            "groups_dropped",
        ]
        return [
            "rollout/reward_mean",
            "rollout/pass_rate",
            "rollout/trajectory_tokens_mean",
            "rollout/scored_tokens_mean",
            "rollout/turns_mean",
            *(f"rollout/{c}_count" for c in counts),
            *(f"rollout/finish_{r}_count" for r in FINISH_REASONS),
            "rollout/reward_std",
            "rollout/failure_rate",
            "rollout/reward_error_fraction",
            "rollout/unscorable_fraction",
            "rollout/invalid_tool_call_fraction",
            "rollout/truncated_action_fraction",
            "rollout/tool_error_fraction",
            "rollout/tool_timeout_fraction",
            "train/loss",
            "train/zero_advantage_group_fraction",
        ]

    @override
    def measure(self, stats: StepStats) -> dict[str, Reduction]:
        trajs = stats.trajectories
        rewards = [float(t.reward) for t in trajs if t.reward is not None and not t.unscorable]
        return {
            "rollout/reward_mean": Mean(rewards),
            "reward_sq_mean": Mean([x * x for x in rewards]),
            "rollout/pass_rate": Mean([float(x >= self.pass_threshold) for x in rewards]),
            "rollout/trajectory_tokens_mean": Mean([float(t.num_tokens) for t in trajs]),
            "rollout/scored_tokens_mean": Mean([float(t.num_scored_tokens) for t in trajs]),
            "rollout/turns_mean": Mean([float(t.num_turns) for t in trajs]),
            "rollout/trajectories_count": Sum(float(len(trajs))),
            "rollout/failures_count": Sum(float(sum(t.failure is not None for t in trajs))),
            "rollout/host_faults_count": Sum(float(sum(t.host_fault for t in trajs))),
            "reward_errors": Sum(float(sum(t.reward_error for t in trajs))),
            "unscorable": Sum(float(sum(t.unscorable for t in trajs))),
            "rollout/groups_folded_count": Sum(float(stats.groups_folded)),
            "rollout/groups_aborted_count": Sum(float(stats.groups_aborted)),
            "rollout/groups_generated_count": Sum(float(stats.groups_generated)),
            "rollout/groups_kept_count": Sum(float(stats.groups_folded)),
            "rollout/groups_dropped_count": Sum(float(stats.groups_filtered)),
            "zero_advantage_groups": Sum(float(stats.zero_advantage_groups)),
            "rewarded_groups": Sum(float(len(stats.group_rewards))),
            "tool_calls": Sum(float(sum(t.tool_calls for t in trajs))),
            "invalid_tool_calls": Sum(float(sum(t.invalid_tool_calls for t in trajs))),
            "actions": Sum(float(sum(t.num_turns for t in trajs))),
            "truncated_actions": Sum(float(sum(t.truncated_actions for t in trajs))),
            "tool_errors": Sum(float(sum(t.tool_errors - t.tool_timeouts for t in trajs))),
            "tool_timeouts": Sum(float(sum(t.tool_timeouts for t in trajs))),
            **{
                f"rollout/reward/{name}_mean": Mean(
                    [v for t in trajs for n, v in t.reward_parts if n == name]
                )
                for name in self.reward_names
            },
            **{
                f"rollout/finish_{r}_count": Sum(float(sum(t.finish_reason == r for t in trajs)))
                for r in FINISH_REASONS
            },
        }

    @override
    def derive(self, reduced: dict[str, float], stats: StepStats) -> dict[str, float]:
        """NaN where no trajectory had a reward; ``train/loss`` is already global."""
        out = super().derive(reduced, stats)
        mean, sq = reduced["rollout/reward_mean"], reduced["reward_sq_mean"]
        out["rollout/reward_std"] = (
            math.sqrt(max(sq - mean * mean, 0.0)) if not math.isnan(mean) else math.nan
        )
        n = reduced["rollout/trajectories_count"]
        out["rollout/failure_rate"] = reduced["rollout/failures_count"] / n if n > 0 else 0.0
        out["rollout/reward_error_fraction"] = reduced["reward_errors"] / n if n > 0 else 0.0
        out["rollout/unscorable_fraction"] = reduced["unscorable"] / n if n > 0 else 0.0
        groups = reduced["rewarded_groups"]
        zero = reduced["zero_advantage_groups"]
        out["train/zero_advantage_group_fraction"] = zero / groups if groups > 0 else math.nan
        calls, invalid = reduced["tool_calls"], reduced["invalid_tool_calls"]
        out["rollout/invalid_tool_call_fraction"] = invalid / calls if calls > 0 else 0.0
        actions = reduced["actions"]
        out["rollout/truncated_action_fraction"] = (
            reduced["truncated_actions"] / actions if actions > 0 else 0.0
        )
        out["rollout/tool_error_fraction"] = reduced["tool_errors"] / calls if calls > 0 else 0.0
        out["rollout/tool_timeout_fraction"] = reduced["tool_timeouts"] / calls if calls > 0 else 0.0
        out["train/loss"] = stats.loss
        return out

    @override
    def after_metrics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, stats: StepStats, metrics: dict[str, float]
    ) -> None:
        self._check_zero_advantage(metrics["train/zero_advantage_group_fraction"])
        self._check_reward_errors(metrics["rollout/reward_error_fraction"], stats)
        self._check_rows(metrics, stats)
        self._check_tool_errors(metrics, stats)

    def _check_tool_errors(self, metrics: dict[str, float], stats: StepStats) -> None:
        """Warn once per kind (a tool that raised, a tool past its deadline) with the first reason."""
        for kind, key, timed_out in (
            ("raised", "rollout/tool_error_fraction", False),
            ("timed out", "rollout/tool_timeout_fraction", True),
        ):
            if kind in self._tool_warned or not metrics[key] > 0:
                continue
            self._tool_warned.add(kind)
            first = next(
                (t for t in stats.trajectories if t.tool_error and (t.tool_timeouts > 0) == timed_out),
                next((t for t in stats.trajectories if t.tool_error), None),
            )
            example = (
                f" The first tool failure of {first.trajectory_id}: {first.tool_error}." if first else ""
            )
            rank_zero_warn(
                f"Step {stats.step}: {metrics[key]:.0%} of the tool calls {kind} ({key}); the model was told "
                f"'[tool error] ...' and the episode went on.{example} Fix the tool"
                + (" or raise the task's tool_timeout_s" if timed_out else "")
                + "; further failures of this kind are counted in the metric and summary.json, not warned."
            )

    def _check_rows(self, metrics: dict[str, float], stats: StepStats) -> None:
        """Warn once with the first data row that failed at reset, and once with the first unscorable
        trajectory (this rank's), whatever their share: each is a fact about the data, not noise."""
        row = next((t for t in stats.trajectories if t.row_error), None)
        if row is not None and not self._row_error_warned:
            self._row_error_warned = True
            rank_zero_warn(
                f"Step {stats.step}: a data row failed at reset ({row.trajectory_id}: {row.failure}); its "
                "trajectories count as reward errors (rollout/reward_error_fraction, summary.json) with "
                "reward 0. Fix the row; further rows are counted, not warned."
            )
        if metrics["rollout/unscorable_fraction"] > 0 and not self._unscorable_warned:
            self._unscorable_warned = True
            rank_zero_warn(
                f"Step {stats.step}: every reward returned None for "
                f"{metrics['rollout/unscorable_fraction']:.0%} of the trajectories "
                "(rollout/unscorable_fraction): they have no reward and an advantage of 0. Make sure at "
                "least one reward scores each row; further steps are counted, not warned."
            )

    def _check_reward_errors(self, fraction: float, stats: StepStats) -> None:
        if self._reward_error_warned or fraction <= self.reward_error_warn_fraction:
            return
        self._reward_error_warned = True
        first = next((t for t in stats.trajectories if t.reward_error), None)
        example = (
            f" The first on this rank ({first.trajectory_id}): {first.failure}" if first is not None else ""
        )
        rank_zero_warn(
            f"Step {stats.step}: the reward of {fraction:.0%} of the trajectories could not be computed "
            f"(rollout/reward_error_fraction > {self.reward_error_warn_fraction:g}); they count as reward 0."
            f"{example}. Fix the reward function or the environment's verdict; trajectories.jsonl has every "
            "failure (python -m thundersync_lightning.show DIR)."
        )

    def _check_zero_advantage(self, fraction: float) -> None:
        self._zero_streak = self._zero_streak + 1 if fraction == 1.0 else 0
        if self.zero_advantage_warn_steps and self._zero_streak == self.zero_advantage_warn_steps:
            rank_zero_warn(
                f"For {self._zero_streak} consecutive steps every group had equal rewards "
                "(train/zero_advantage_group_fraction = 1): all advantages are 0, the gradient is 0 and the "
                "policy does not change. The tasks are too hard (or too easy) for the current policy: use "
                "easier tasks, a stronger starting model, a larger group_size, "
                "or a reward with partial credit."
            )
