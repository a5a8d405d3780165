"""Dynamic sampling inside a step: a group without signal is replaced by the next reserve group.

When every verdict of a group is in and its kept rewards carry no signal (the accumulator's own
test, :meth:`StepGroups.informative
<thundersync_lightning.core.accumulator.step_groups.StepGroups.informative>`: the accumulator filters that
group), the next reserve group is issued at once, from the weights the engine holds (this step's in streaming
and sync: staleness 0), and its events join the stream, until the reserve is spent. Every mode issues the same
replacements (sync waits for them before its learner work), so they train on the same kept groups.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from ..core.accumulator.streaming import StreamingGRPO
from ..core.errors import GroupError
from ..core.types import GroupRequest, RolloutEvent, RolloutRequest
from .records import StepOutcome

__all__ = ["Replacements", "ReplacementIssuer"]

IssueFn = Callable[[RolloutRequest], Iterator[RolloutEvent]]


@dataclass(frozen=True)
class Replacements:
    """The replacement groups in the order they are issued, and the engine call that issues one
    (``engine.rollout``)."""

    reserve: Sequence[GroupRequest]
    issue: IssueFn


class ReplacementIssuer:
    """Decides, once per group with every verdict in, whether to issue a replacement (module docstring)."""

    def __init__(
        self,
        replacements: Replacements,
        request: RolloutRequest,
        accumulator: StreamingGRPO,
        outcome: StepOutcome,
    ) -> None:
        if replacements.reserve and not accumulator.filter_groups:
            raise GroupError("StepRunner: replacement groups need an accumulator with filter_groups=True")
        self._reserve = list(replacements.reserve)
        self._issue = replacements.issue
        self._request = request
        self._acc = accumulator
        self._outcome = outcome
        self._decided: set[str] = set()

    def after_verdict(self, group_id: str) -> Iterator[RolloutEvent] | None:
        """The events of a replacement for ``group_id`` if it is due now (planned in the accumulator)."""
        planned = self._acc.planned
        if group_id in self._decided or not planned.verdicts_in(group_id):
            return None
        self._decided.add(group_id)
        if planned.informative(group_id):
            return None
        self._outcome.groups_filtered += 1
        if not self._reserve:
            return None
        group = self._reserve.pop(0)
        request = RolloutRequest(step=self._request.step, groups=(group,), seed=self._request.seed)
        self._acc.plan_groups(request.trajectory_ids())
        self._outcome.groups_generated += 1
        return self._issue(request)
