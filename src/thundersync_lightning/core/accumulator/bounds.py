"""The accumulator's memory bounds: open groups and held (reward-pending) gradients.

Per open group the accumulator keeps up to two parameter-sized sums; per trajectory
backpropagated before its reward one more parameter-sized gradient is *held* (two under
``failed="drop"`` with regulariser terms: grad S_i and grad R_i) until the reward lands.
With P parameters in a dtype of b bytes, K open groups and H held trajectories the sums and held
gradients take at most

    (2 K + 2 H) P b  bytes,  K <= max_open_groups,  H <= max_held_trajectories.

A backward backend may keep a sum or a held gradient in a deferred form
(:mod:`~thundersync_lightning.core.gradients.deferred`); a group's deferred gradients never take more bytes
than the dense buffers they stand for, so the bound holds for them too (``peak_held_bytes``
counts a held deferred gradient's own bytes).

Both checks run before any state changes: a refused call leaves the accumulator as it was.

- ``max_open_groups``: ``open_group`` raises :class:`OpenGroupLimitError` when that many groups
  are already open (declared, not yet folded or aborted). The caller admits groups as slots free
  up (the strategy's runner defers a group's events until it is admitted).
- ``max_held_trajectories``: ``add_tokens`` raises :class:`HeldGradientLimitError` when it would
  make more trajectories hold a gradient than the bound. The caller backpropagates such a
  trajectory once its reward is known instead (it then joins its group's sum for that reward, or
  the step's gradient, and holds nothing); the strategy's runner waits for rewards when the bound
  is full and keeps doing reward-known work. ``0`` is legal and means "never hold": every backward
  waits for its trajectory's reward (no parameter-sized memory beyond the sums, less overlap).

A group with a failure scored at its worst graded reward (``Objective.failure_reward`` None) keeps
one more sum, F, of those failures' gradients until its last verdict (at most ``G`` buffers per group
still: each scored member adds to at most one); a configured ``failure_reward`` needs none.

The gradient is the same for every bound (only the summation order changes).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from ..errors import ConfigError, HeldGradientLimitError, OpenGroupLimitError
from .group import GroupSums, GroupUsage

__all__ = ["AccumulatorBounds", "Bounds", "bound_problems"]


def bound_problems(max_open_groups: int | None, max_held_trajectories: int | None) -> list[str]:
    """Every invalid bound, as ``ConfigError`` message parts (empty when both are valid)."""
    problems = []
    if max_open_groups is not None and max_open_groups < 1:
        problems.append(f"max_open_groups must be >= 1 or None, got {max_open_groups}")
    if max_held_trajectories is not None and max_held_trajectories < 0:
        problems.append(
            f"max_held_trajectories must be >= 0 or None (0: never hold, wait for each reward), got "
            f"{max_held_trajectories}"
        )
    return problems


@dataclass(frozen=True, slots=True)
class AccumulatorBounds:
    """Both bounds, checked once, where they are made (a ``ConfigError`` naming every invalid one).

    The strategy makes them from its options and hands this one object down (its learner, then
    ``StreamingGRPO(bounds=...)``): a layer in between carries no parameter of its own for them.
    """

    max_open_groups: int | None = None
    max_held_trajectories: int | None = None

    def __post_init__(self) -> None:
        problems = bound_problems(self.max_open_groups, self.max_held_trajectories)
        if problems:
            raise ConfigError("; ".join(problems))

    def buffers(self, held_regulariser: bool = False) -> int:
        """Parameter-sized buffers both bounds allow at once, ``2 K + H`` (``2 K + 2 H`` when a held
        trajectory also holds its regulariser gradient); 0 when a bound is unset."""
        if self.max_open_groups is None or self.max_held_trajectories is None:
            return 0
        return 2 * self.max_open_groups + (2 if held_regulariser else 1) * self.max_held_trajectories


class Bounds:
    """Checks both bounds (an :class:`AccumulatorBounds`) and counts held gradients (current and
    peak in the step)."""

    def __init__(self, limits: AccumulatorBounds) -> None:
        self.limits = limits
        self.reset()

    @property
    def max_open_groups(self) -> int | None:
        return self.limits.max_open_groups

    @property
    def max_held_trajectories(self) -> int | None:
        return self.limits.max_held_trajectories

    def buffers(self, held_regulariser: bool = False) -> int:
        return self.limits.buffers(held_regulariser)

    def reset(self) -> None:
        self.held = self.peak_held = self.held_bytes = self.peak_held_bytes = 0
        self._usage: dict[Hashable, GroupUsage] = {}  # per open group, refreshed by recount

    def check_open(self, group_id: Hashable, open_groups: int) -> None:
        limit = self.max_open_groups
        if limit is not None and open_groups >= limit:
            raise OpenGroupLimitError(
                f"cannot open group {group_id!r}: {open_groups} groups are open and "
                f"max_open_groups={limit}; fold or abort one first, or raise the limit"
            )

    def check_held(self, trajectory_ids: Iterable[Hashable]) -> None:
        """Raise if holding gradients of these (reward-pending) trajectories would pass the bound."""
        limit = self.max_held_trajectories
        new = sorted(set(trajectory_ids), key=str)
        if limit is None or not new or self.held + len(new) <= limit:
            return
        raise HeldGradientLimitError(
            f"cannot backpropagate {new} before their rewards: {self.held} trajectories already hold a "
            f"gradient and max_held_trajectories={limit} (each holds up to a parameter-sized buffer until "
            "its reward lands); deliver their rewards (add_reward) first, or raise the limit"
        )

    def recount(
        self, groups: Mapping[Hashable, GroupSums], touched: Iterable[Hashable], buffer_bytes: int
    ) -> int:
        """Recount the ``touched`` groups from themselves (the one source of truth; a group no
        longer in ``groups`` is forgotten), update the held counts and peaks over every open group,
        and return the device bytes the groups hold outside flat buffers (deferred gradients, leaf sums)."""
        for gid in touched:
            group = groups.get(gid)
            if group is None:
                self._usage.pop(gid, None)
            else:
                self._usage[gid] = group.usage(buffer_bytes)
        usages = self._usage.values()
        self.held = sum(u.held for u in usages)
        self.held_bytes = sum(u.held_bytes for u in usages)
        self.peak_held = max(self.peak_held, self.held)
        self.peak_held_bytes = max(self.peak_held_bytes, self.held_bytes)
        return sum(u.side_bytes for u in usages)
