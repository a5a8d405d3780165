"""What the dataloader hands the strategy: a plan, not data.

A Lightning dataloader is read one batch ahead of the step that uses it (the prefetch trap in the
field notes). If batches held rollouts, step k+1's rollouts would be generated before step k's
weights exist. So the dataloader yields a :class:`RolloutBatch` and the *strategy* asks it for the
request of the step it is running, after publishing that step's weights: prefetching a plan is
harmless by construction.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .protocols import RolloutEngine, TaskSource
from .types import GroupRequest, RolloutRequest, group_id

__all__ = ["RolloutBatch", "BatchLoader"]


class RolloutBatch:
    """Which tasks every step trains on, split across data-parallel ranks.

    Step k uses ``tasks.tasks(k, groups_per_step, seed)``; group i goes to rank ``i % world_size``.
    Trajectory seeds derive from (seed, step, group index, sample) only, so the union over ranks
    of the trajectories is the same for any number of learner processes.

    Dynamic sampling (``max_extra_groups`` > 0): step k samples ``groups_per_step +
    max_extra_groups`` tasks at once; the first ``groups_per_step`` are the step's groups, the
    rest its *reserve*, issued one group at a time (in index order) to replace a group whose
    verdicts carry no signal (:meth:`reserve`). Reserve group i goes to rank ``i % world_size`` too.

    A plain class (not a dataclass): Lightning's batch transfer would try to copy a dataclass.
    """

    __slots__ = ("tasks", "engine", "group_size", "groups_per_step", "seed", "max_extra_groups")

    def __init__(
        self,
        tasks: TaskSource,
        engine: RolloutEngine,
        group_size: int,
        groups_per_step: int,
        seed: int,
        max_extra_groups: int = 0,
    ) -> None:
        self.tasks = tasks
        self.engine = engine
        self.group_size = group_size
        self.groups_per_step = groups_per_step
        self.seed = seed
        self.max_extra_groups = max_extra_groups

    @property
    def dynamic_sampling(self) -> bool:
        return self.max_extra_groups > 0

    def _groups(self, step: int, rank: int, world_size: int) -> list[GroupRequest]:
        count = self.groups_per_step + self.max_extra_groups
        payloads = list(self.tasks.tasks(step, count, self.seed))
        if len(payloads) != count:
            raise ValueError(
                f"{type(self.tasks).__name__}.tasks returned {len(payloads)} tasks for step {step}; "
                f"groups_per_step + max_extra_groups is {count}"
            )
        return [
            GroupRequest(group_id(step, i), i, task, self.group_size)
            for i, task in enumerate(payloads)
            if i % world_size == rank
        ]

    def request(self, step: int, rank: int = 0, world_size: int = 1) -> RolloutRequest:
        groups = tuple(
            g for g in self._groups(step, rank, world_size) if g.group_index < self.groups_per_step
        )
        return RolloutRequest(step=step, groups=groups, seed=self.seed)

    def reserve(self, step: int, rank: int = 0, world_size: int = 1) -> tuple[GroupRequest, ...]:
        """This rank's replacement groups of step ``step``, in the order they are issued (empty
        without dynamic sampling)."""
        if not self.dynamic_sampling:
            return ()
        return tuple(g for g in self._groups(step, rank, world_size) if g.group_index >= self.groups_per_step)


class BatchLoader:
    """An iterable of ``len(self)`` copies of one plan: one item per optimizer step.

    It has a length so Lightning does not treat it as an endless stream.
    """

    def __init__(self, plan: RolloutBatch, steps_per_epoch: int) -> None:
        self.plan = plan
        self.steps_per_epoch = steps_per_epoch

    def __len__(self) -> int:
        return self.steps_per_epoch

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.steps_per_epoch):
            yield self.plan

    # Resumable by construction: the global step, not the loader's position, selects the tasks.
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None
