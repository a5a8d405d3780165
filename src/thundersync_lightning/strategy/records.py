"""A step's records on one learner process: what arrived, what the learner did, and its progress.

:class:`StepOutcome` is what the runner hands the barrier: the trajectories and (shaped) rewards
that arrived, failures, the learner's busy intervals, the open-group count over time and the
counts of dynamic sampling; :meth:`StepOutcome.records` turns it into the ``StepStats``
trajectory records. :class:`ProgressReport` calls the progress listener at most every
``interval_s`` (and once at the end).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..core.types import Trajectory
from .stats import Interval, RolloutProgress, TrajectoryRecord

__all__ = ["StepOutcome", "ProgressReport", "progress_listener"]


@dataclass
class StepOutcome:
    trajectories: dict[str, Trajectory] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    reward_times: dict[str, float] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    reward_parts: dict[str, tuple[tuple[str, float], ...]] = field(default_factory=dict)
    host_faults: set[str] = field(default_factory=set)  # failures that may be dropped (failed="drop")
    unscorable: set[str] = field(default_factory=set)  # every reward declined them (advantage 0)
    busy: list[Interval] = field(default_factory=list)
    open_groups: list[tuple[float, int]] = field(default_factory=list)
    learner_tokens: int = 0
    min_batch_trajectories: int = 1  # the rows a call waited for while content was to land
    max_batch_trajectories: int = 0  # the most rows of one call
    hold_after_s: float = 0.0  # a reward-pending row was held only once its content waited this long
    reward_lags: list[float] = field(default_factory=list)  # content to reward, as the learner saw them
    groups_generated: int = 0  # groups requested this step, replacements included
    groups_filtered: int = 0  # dynamic sampling: groups whose verdicts carried no signal

    def records(self, version: int) -> tuple[TrajectoryRecord, ...]:
        out = []
        for tid, t in self.trajectories.items():
            out.append(
                TrajectoryRecord(
                    trajectory_id=tid,
                    group_id=t.group_id,
                    policy_version=t.policy_version,
                    staleness=version - t.policy_version,
                    reward=None if tid in self.unscorable else self.rewards.get(tid),
                    num_tokens=len(t.tokens),
                    num_scored_tokens=t.num_scored_tokens,
                    num_turns=t.num_turns,
                    finish_reason=t.finish_reason,
                    failure=self.failures.get(tid) or t.failure,
                    host_fault=tid in self.host_faults,
                    unscorable=tid in self.unscorable,
                    content_ready_at=t.content_ready_at,
                    reward_ready_at=self.reward_times.get(tid),
                    prompt=t.prompt,
                    segments=t.segments,
                    tool_calls=t.tool_calls,
                    invalid_tool_calls=t.invalid_tool_calls,
                    truncated_actions=t.truncated_actions,
                    tool_errors=t.tool_errors,
                    tool_timeouts=t.tool_timeouts,
                    tool_error=t.tool_error,
                    reward_parts=self.reward_parts.get(tid, ()),
                )
            )
        return tuple(out)


class ProgressReport:
    """Throttled :class:`RolloutProgress` of one step to ``listener`` (None: nothing is reported)."""

    def __init__(
        self,
        listener: Callable[[RolloutProgress], None] | None,
        interval_s: float,
        step: int,
        clock: Callable[[], float],
    ) -> None:
        self.listener = listener
        self.interval_s = interval_s
        self.step = step
        self.clock = clock
        self._start = clock()
        self._last = float("-inf")

    def __call__(self, outcome: StepOutcome, total: int, open_groups: int, final: bool) -> None:
        if self.listener is None:
            return
        now = self.clock()
        if not final and now - self._last < self.interval_s:
            return
        self._last = now
        elapsed = now - self._start
        busy = sum(i.seconds for i in outcome.busy)
        self.listener(
            RolloutProgress(
                step=self.step,
                trajectories_total=total,
                content_ready=len(outcome.trajectories),
                reward_ready=len(outcome.rewards),
                open_groups=open_groups,
                elapsed_seconds=elapsed,
                idle_seconds=max(0.0, elapsed - busy),
            )
        )


def progress_listener(trainer: Any) -> Callable[[RolloutProgress], None] | None:
    """Calls every callback's ``on_rollout_progress`` (None when no callback has one)."""
    listeners = [cb for cb in trainer.callbacks if callable(getattr(cb, "on_rollout_progress", None))]
    if not listeners:
        return None
    module = trainer.lightning_module

    def push(progress: RolloutProgress) -> None:
        for cb in listeners:
            cb.on_rollout_progress(trainer, module, progress)

    return push
