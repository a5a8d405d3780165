"""Building a :class:`RolloutRequest` from a task source (the learner's side of a step)."""

from __future__ import annotations

from ..core.protocols import TaskSource
from ..core.types import GroupRequest, RolloutRequest, group_id

__all__ = ["make_request"]


def make_request(
    tasks: TaskSource,
    step: int,
    num_groups: int,
    group_size: int,
    seed: int,
    group_indices: range | list[int] | None = None,
) -> RolloutRequest:
    """The request for ``step``: groups ``group_indices`` (default all) of ``num_groups``.

    Tasks and seeds depend on (seed, step, group index) only, so a learner process that asks
    for a subset of the groups (data parallel) gets exactly those groups of the full batch.
    """
    payloads = tasks.tasks(step, num_groups, seed)
    indices = range(num_groups) if group_indices is None else group_indices
    groups = tuple(GroupRequest(group_id(step, g), g, payloads[g], group_size) for g in indices)
    return RolloutRequest(step=step, groups=groups, seed=seed)
