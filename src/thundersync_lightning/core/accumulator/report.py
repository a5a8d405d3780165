"""What the streaming accumulator reports at the batch barrier."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field

from ..gradients.storage import ByteUsage
from ..grpo.objective import BatchTotals
from ..grpo.terms import OnPolicyStats

__all__ = ["GroupStat", "StreamingReport"]


@dataclass(frozen=True, slots=True)
class GroupStat:
    group_id: Hashable
    size: int  # members kept (failed members dropped under failed="drop" do not count)
    reward_mean: float
    reward_std: float  # population std of the kept rewards (unscorable members left out)
    dropped: int = 0
    unscorable: int = 0  # kept members every reward declined: out of the statistics, advantage 0


@dataclass(frozen=True, slots=True)
class StreamingReport:
    """What the barrier folded on this process.

    ``peak_held_trajectories`` is the most reward-pending trajectories that held a parameter-sized
    gradient at once, ``peak_held_bytes`` the most bytes those held gradients took (also counted in
    ``peak_bytes``, by location).

    ``objective`` = sum_i A'_i S_i over kept trajectories, with A' the advantage before the batch
    scale s, and ``regulariser`` = sum_i R_i; the loss is ``-(s * objective + regulariser) / D``
    with the global ``batch_scale`` s and ``denominator`` D (``loss`` holds it for one process;
    data-parallel callers sum the two parts over ranks first).
    """

    groups_folded: int
    groups_aborted: int
    trajectories: int
    num_groups: int
    objective: float
    groups: tuple[GroupStat, ...]
    peak_bytes: ByteUsage
    backward_passes: int
    skipped_backward_passes: int
    regulariser: float = 0.0
    denominator: float = 0.0
    batch_scale: float = 1.0
    totals: BatchTotals = field(default_factory=BatchTotals)
    on_policy: OnPolicyStats = field(default_factory=OnPolicyStats)
    dropped: int = 0
    unscorable: int = 0  # kept trajectories every reward declined (advantage 0)
    peak_held_trajectories: int = 0
    peak_held_bytes: int = 0
    groups_filtered: int = 0  # dynamic sampling: groups closed without signal, counted nowhere

    @property
    def loss(self) -> float:
        if self.denominator <= 0:
            return 0.0
        return -(self.batch_scale * self.objective + self.regulariser) / self.denominator
