"""The step's ledger: what its closed groups add up to, and the counts the barrier reports.

A group closes once every verdict is in and every kept member is scored: a folded group adds its
objective parts (sum_i A'_i S_i, sum_i R_i), its counts and its statistics; a filtered one
(dynamic sampling) only its statistics. Dropped members of closed groups are remembered (and
whether their content came), so a late scoring of one counts nowhere and a second one is refused.
"""

from __future__ import annotations

from collections.abc import Hashable

from ..gradients.storage import ByteUsage
from ..grpo.objective import BatchTotals
from ..grpo.terms import OnPolicyStats
from .group import GroupSums
from .report import GroupStat, StreamingReport

__all__ = ["StepLedger"]


class StepLedger:
    """Closed groups, objective parts, counts and backward passes of one step."""

    def __init__(self) -> None:
        self.folded: list[GroupStat] = []
        self.filtered: list[GroupStat] = []
        self.aborted = 0
        self.objective = 0.0
        self.regulariser = 0.0
        self.totals = BatchTotals()
        self.on_policy = OnPolicyStats()
        self.backward_passes = 0
        self.skipped = 0
        self.dropped_closed: dict[Hashable, bool] = {}  # dropped members of closed groups -> content seen

    def was_folded(self, group_id: Hashable) -> bool:
        return any(s.group_id == group_id for s in self.folded)

    def close(self, group_id: Hashable, group: GroupSums, a: float, b: float) -> None:
        """Record a complete group (coefficients ``a``, ``b``): folded, or filtered (counts nowhere)."""
        closed = group.close(group_id, a, b)
        self.dropped_closed.update(group.dropped_members())
        if group.filtered:
            self.filtered.append(closed.stat)
            return
        self.objective += closed.objective
        self.regulariser += closed.regulariser
        self.totals = self.totals + closed.totals
        self.folded.append(closed.stat)

    def report(
        self,
        glob: BatchTotals,
        denominator: float,
        batch_scale: float,
        peak: ByteUsage,
        held: tuple[int, int],
    ) -> StreamingReport:
        """The barrier's report (``glob``: the global counts; ``held``: peak held trajectories and bytes)."""
        return StreamingReport(
            groups_folded=len(self.folded),
            groups_aborted=self.aborted,
            groups_filtered=len(self.filtered),
            trajectories=sum(s.size for s in self.folded),
            num_groups=int(glob.groups),
            objective=self.objective,
            groups=tuple(self.folded),
            peak_bytes=peak,
            backward_passes=self.backward_passes,
            skipped_backward_passes=self.skipped,
            regulariser=self.regulariser,
            denominator=denominator,
            batch_scale=batch_scale,
            totals=self.totals,
            on_policy=self.on_policy,
            dropped=sum(s.dropped for s in self.folded),
            unscorable=sum(s.unscorable for s in self.folded),
            peak_held_trajectories=held[0],
            peak_held_bytes=held[1],
        )
