"""Typed per-step statistics the strategy records and callbacks read.

All times are ``time.monotonic()`` seconds on the learner process. One :class:`StepStats` per
optimizer step per rank; ``strategy.last_step_stats`` holds the latest, set just before
``on_train_batch_end`` runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ..core.gradients.storage import ByteUsage
from ..core.types import Segment
from .batching import BatchPath

__all__ = ["TrajectoryRecord", "Interval", "AccumulatorBytes", "StepStats", "RolloutProgress"]


@dataclass(frozen=True, slots=True)
class TrajectoryRecord:
    """One trajectory of a step as the learner saw it. ``prompt`` and ``segments`` are its token
    ids (the prompt, then alternating scored actions and unscored observations), so that callbacks
    can decode what the agent did; they are empty where a producer did not fill them in."""

    trajectory_id: str
    group_id: str
    policy_version: int
    staleness: int  # trained version - policy_version
    reward: float | None
    num_tokens: int
    num_scored_tokens: int
    num_turns: int
    finish_reason: str
    failure: str | None
    content_ready_at: float
    reward_ready_at: float | None
    prompt: tuple[int, ...] = ()
    segments: tuple[Segment, ...] = ()
    tool_calls: int = 0
    invalid_tool_calls: int = 0
    truncated_actions: int = 0  # actions that reached their token budget without ending the turn
    tool_errors: int = 0  # calls whose tool raised, died or overran its deadline
    tool_timeouts: int = 0  # of which past the deadline
    tool_error: str | None = None  # the first tool failure's reason
    reward_parts: tuple[tuple[str, float], ...] = ()  # (name, r_i) of a weighted sum of rewards
    host_fault: bool = False  # the failure is one no action caused (a host fault: may leave its group)
    unscorable: bool = (
        False  # every reward declined it (TRL's None): out of its group's statistics, advantage 0
    )

    @property
    def reward_error(self) -> bool:
        """The reward could not be computed: the verdict raised, timed out or was not a finite number
        (a failure of an episode that itself finished), a reward function raised while the
        environment graded a turn (``RewardError``), or the task's data row could not be an episode
        (``DatasetRowError``, at reset). The trajectory's reward is then 0."""
        if self.failure is None:
            return False
        return self.finish_reason != "failure" or "RewardError: " in self.failure or self.row_error

    @property
    def row_error(self) -> bool:
        """The episode failed because its data row cannot be one (a null field, a malformed prompt)."""
        return self.failure is not None and "DatasetRowError: " in self.failure


@dataclass(frozen=True, slots=True)
class Interval:
    """A span of learner work: ``kind`` is "backward", "fold", "barrier", "optimizer" or "publish".

    A "backward" (one scoring call and its backward passes) also says how many ``trajectories`` it
    took, their ``tokens`` (prompts included: what ``max_batch_tokens`` bounds) and which rule of
    :func:`~thundersync_lightning.strategy.batching.next_batch` chose them (``path``: "direct",
    "bucket" or "held"); other kinds leave them 0 and "".
    """

    start: float
    end: float
    kind: str
    trajectories: int = 0
    path: BatchPath | Literal[""] = ""
    tokens: int = 0

    @property
    def seconds(self) -> float:
        return self.end - self.start


#: Peak bytes held by the streaming accumulator during the step, by where they lived.
AccumulatorBytes = ByteUsage


@dataclass(frozen=True, slots=True)
class StepStats:
    """What happened on this rank during one RL step (one logical batch, one optimizer step).

    Invariants: ``step_start <= every interval start <= every interval end <= step_end``; busy
    intervals do not overlap; in ``streaming`` and ``sync`` modes every record's staleness is 0.
    """

    step: int
    mode: str
    policy_version: int  # version of the weights this step updates
    rank: int
    world_size: int
    step_start: float
    step_end: float
    trajectories: tuple[TrajectoryRecord, ...]
    busy: tuple[Interval, ...]
    open_groups: tuple[tuple[float, int], ...]  # (time, number of open groups) after each change
    accumulator: AccumulatorBytes = field(default_factory=AccumulatorBytes)
    groups_folded: int = 0
    groups_aborted: int = 0
    peak_held_trajectories: int = 0  # most reward-pending trajectories holding a gradient at once
    peak_held_bytes: int = 0  # most bytes held gradients took at once (also in ``accumulator``, by location)
    num_groups_global: int = 0
    learner_tokens: int = 0  # tokens the learner ran forward+backward on this rank this step
    backward_passes: int = (
        0  # the accumulator's backward passes (one per destination of a call, or one per split call)
    )
    loss: float = 0.0  # the global surrogate loss -(1/N) sum A_i S_i
    rollout_issued_at: float | None = None  # when the step's rollout was requested (may precede step_start)
    min_batch_trajectories: int = 1  # rows a learner call waited for while content was to land (1: none)
    max_batch_trajectories: int = 0  # the most rows of one learner call ("auto" resolved; 0: not recorded)
    hold_after_s: float = 0.0  # a reward-pending trajectory was held only once its content waited this long
    groups_generated: int = (
        0  # groups requested this step on this rank, dynamic-sampling replacements included
    )
    groups_filtered: int = (
        0  # dynamic sampling: groups without signal, counted nowhere (replaced while the reserve lasts)
    )
    # on-policy check over every rank's scored tokens (None: the engine reported no logprobs)
    logprob_diff_mean: float | None = None  # mean |logp_engine - logp_learner|
    logprob_diff_max: float | None = None  # max |logp_engine - logp_learner|
    engine_learner_kl: float | None = None  # k3 estimate of KL(engine || learner) per token

    @property
    def wall_seconds(self) -> float:
        return self.step_end - self.step_start

    @property
    def busy_seconds(self) -> float:
        return sum(i.seconds for i in self.busy)

    @property
    def idle_seconds(self) -> float:
        return max(0.0, self.wall_seconds - self.busy_seconds)

    @property
    def idle_fraction(self) -> float:
        wall = self.wall_seconds
        return self.idle_seconds / wall if wall > 0 else 0.0

    @property
    def first_event_delay(self) -> float:
        """Seconds from the rollout request to the first trajectory's content.

        With ``launch_ahead`` the request is issued at the previous barrier, before ``step_start``.
        """
        if not self.trajectories:
            return 0.0
        origin = self.rollout_issued_at if self.rollout_issued_at is not None else self.step_start
        return max(0.0, min(t.content_ready_at for t in self.trajectories) - origin)

    @property
    def tail_seconds(self) -> float:
        """Seconds from the last event (content or reward) to the end of the step."""
        if not self.trajectories:
            return 0.0
        last = max(max(t.content_ready_at, t.reward_ready_at or 0.0) for t in self.trajectories)
        return max(0.0, self.step_end - last)

    @property
    def staleness_max(self) -> int:
        return max((t.staleness for t in self.trajectories), default=0)

    @property
    def group_rewards(self) -> dict[str, tuple[float, ...]]:
        """Known rewards of this rank's trajectories, by group."""
        out: dict[str, list[float]] = {}
        for t in self.trajectories:
            if t.reward is not None:
                out.setdefault(t.group_id, []).append(t.reward)
        return {g: tuple(r) for g, r in out.items()}

    @property
    def zero_advantage_groups(self) -> int:
        """Groups whose known rewards are all equal: every advantage is 0, they add no gradient."""
        return sum(len(set(r)) == 1 for r in self.group_rewards.values())

    @property
    def staleness_mean(self) -> float:
        if not self.trajectories:
            return 0.0
        return sum(t.staleness for t in self.trajectories) / len(self.trajectories)


@dataclass(frozen=True, slots=True)
class RolloutProgress:
    """Live progress inside a step, pushed to every callback that defines
    ``on_rollout_progress(trainer, pl_module, progress)`` (throttled; always once at the barrier)."""

    step: int
    trajectories_total: int
    content_ready: int
    reward_ready: int
    open_groups: int
    elapsed_seconds: float
    idle_seconds: float
