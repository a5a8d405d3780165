"""The step's groups as planned: members, owners and verdicts, before and after a group is opened.

A learner plans every group of its request (and each dynamic-sampling replacement as it is
issued) before the group's events arrive; a group is *opened* in the accumulator (buffers) only
when the memory bounds admit it. Verdicts are noted as they arrive, opened or not, so the
accumulator answers for any planned trajectory: whether its failed verdict drops it
(``failed="drop"``) and, once every verdict of its group is in, whether the group carries signal
(:func:`~thundersync_lightning.core.grpo.group_filter.informative`, the test the accumulator
filters by under dynamic sampling).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

from ..errors import DuplicateEventError, GroupError
from ..grpo.group_filter import informative
from ..grpo.objective import Objective

__all__ = ["StepGroups"]


class StepGroups:
    """Members, owner and verdicts of every planned group of one step (see the module docstring)."""

    def __init__(self, objective: Objective) -> None:
        self._objective = objective
        self._members: dict[Hashable, tuple[Hashable, ...]] = {}
        self._owner: dict[Hashable, Hashable] = {}
        self._rewards: dict[Hashable, float] = {}
        self._failed: set[Hashable] = set()  # droppable (host-fault) failures
        self._floored: set[Hashable] = set()  # failures scored at the floor
        self._unscorable: set[Hashable] = set()

    def plan(self, group_id: Hashable, members: Sequence[Hashable]) -> None:
        """Plan a group and all its trajectories (raises if the group or a member is planned already)."""
        if group_id in self._members:
            raise GroupError(f"group {group_id!r} is planned twice in this step")
        taken = [t for t in members if t in self._owner]
        if taken:
            raise DuplicateEventError(
                f"trajectories {taken} of group {group_id!r} already belong to another group"
            )
        self._members[group_id] = tuple(members)
        self._owner.update({t: group_id for t in members})

    @property
    def owners(self) -> Mapping[Hashable, Hashable]:
        """Trajectory -> its group (read-only view; grows as groups are planned)."""
        return self._owner

    @property
    def membership(self) -> Mapping[Hashable, tuple[Hashable, ...]]:
        """Group -> its members, in planning order (read-only view)."""
        return self._members

    def owner(self, trajectory_id: Hashable) -> Hashable | None:
        return self._owner.get(trajectory_id)

    def members(self, group_id: Hashable) -> tuple[Hashable, ...]:
        return self._members[group_id]

    @property
    def num_trajectories(self) -> int:
        return len(self._owner)

    def note_verdict(
        self,
        trajectory_id: Hashable,
        reward: float,
        failed: bool,
        *,
        failure: bool = False,
        unscorable: bool = False,
    ) -> None:
        """A verdict arrived (its group opened or not): ``reward`` as the objective sees it (shaped);
        ``failed``: a host-fault failure (dropped under ``failed="drop"``); ``failure``: any failed
        verdict (scored at the floor unless dropped); ``unscorable``: every reward declined it."""
        self._rewards[trajectory_id] = reward
        if failed:
            self._failed.add(trajectory_id)
        if failed or failure:
            self._floored.add(trajectory_id)
        elif unscorable:
            self._unscorable.add(trajectory_id)

    def is_dropped(self, trajectory_id: Hashable) -> bool:
        """Its verdict failed and failed rollouts are dropped: it is never scored and counts nowhere."""
        return self._objective.failed == "drop" and trajectory_id in self._failed

    def verdicts_in(self, group_id: Hashable) -> bool:
        return all(t in self._rewards for t in self._members[group_id])

    def informative(self, group_id: Hashable) -> bool:
        """Every verdict of the group is in and its kept rewards carry signal (dynamic sampling)."""
        kept = [t for t in self._members[group_id] if not self.is_dropped(t) and t not in self._unscorable]
        rewards = self._objective.scored_rewards(
            [self._rewards[t] for t in kept], [t in self._floored for t in kept]
        )
        return informative(rewards, self._objective.singleton == "reward")
