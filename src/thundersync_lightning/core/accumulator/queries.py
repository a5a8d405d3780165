"""What the learner may ask the streaming accumulator: its bounds and usage, its counts so far, the
step's planned groups (members, owners, dropped members, informative groups) and what scoring needs.

:class:`~thundersync_lightning.core.accumulator.streaming.StreamingGRPO` answers through these
read-only queries; its events (open a group, add tokens, add a reward, finish) change its state.
The learner reads no ``Objective`` field: each question the step's work asks is one of these.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence

import torch

from ..errors import ConfigError
from ..gradients.storage import ByteUsage, GradientStore
from ..grpo.objective import BatchTotals, Objective
from ..grpo.terms import OnPolicyStats
from ..scoring import score_needs, step_entropy_threshold
from .bounds import Bounds
from .group import GroupSums
from .ledger import StepLedger
from .step_groups import StepGroups

__all__ = ["AccumulatorQueries"]


class AccumulatorQueries:
    """The read-only side of :class:`~thundersync_lightning.core.accumulator.streaming.StreamingGRPO`."""

    objective: Objective
    _params: list[torch.Tensor]
    _bounds: Bounds
    _store: GradientStore
    _ledger: StepLedger
    _planned: StepGroups
    _groups: dict[Hashable, GroupSums]

    def _group_of(self, trajectory_id: Hashable) -> tuple[Hashable, GroupSums]:
        raise NotImplementedError  # StreamingGRPO's: the open group of a trajectory

    @property
    def estimator(self) -> str:
        return self.objective.estimator

    @property
    def eps(self) -> float:
        return self.objective.eps

    @property
    def open_groups(self) -> tuple[Hashable, ...]:
        return tuple(self._groups)

    @property
    def params(self) -> tuple[torch.Tensor, ...]:
        """The tensors whose ``.grad`` the barrier writes."""
        return tuple(self._params)

    @property
    def groups_folded(self) -> int:
        return len(self._ledger.folded)

    @property
    def groups_filtered(self) -> int:
        """Groups closed without signal under ``filter_groups`` (counted nowhere)."""
        return len(self._ledger.filtered)

    @property
    def bytes_in_use(self) -> ByteUsage:
        return self._store.current()

    @property
    def peak_bytes(self) -> ByteUsage:
        return self._store.peak()

    @property
    def max_open_groups(self) -> int | None:
        return self._bounds.max_open_groups

    @property
    def max_held_trajectories(self) -> int | None:
        return self._bounds.max_held_trajectories

    @property
    def held_trajectories(self) -> int:
        """Trajectories backpropagated before their reward, each holding a gradient until it lands."""
        return self._bounds.held

    @property
    def peak_held_bytes(self) -> int:
        """Most bytes held gradients took at once in this step (wherever ``offload`` put them)."""
        return self._bounds.peak_held_bytes

    def totals(self) -> BatchTotals:
        """This process's counts so far (sum them over ranks for :meth:`finish`)."""
        return self._ledger.totals

    @property
    def on_policy(self) -> OnPolicyStats:
        return self._ledger.on_policy

    def objective_parts(self) -> tuple[float, float]:
        """(sum_i A'_i S_i, sum_i R_i) over the groups closed so far (sum them over ranks)."""
        return self._ledger.objective, self._ledger.regulariser

    def needs_score(self, trajectory_id: Hashable) -> bool:
        """False for a trajectory already dropped (failed verdict, ``failed="drop"``): skip its forward."""
        if trajectory_id in self._ledger.dropped_closed:
            return False
        gid, group = self._group_of(trajectory_id)
        return not group.is_dropped(trajectory_id) and not group.filtered

    # ------------------------------------------------------------------ what the learner asks
    @property
    def planned(self) -> StepGroups:
        """The step's planned groups: members, owners, verdicts, dropped members, informative groups."""
        return self._planned

    def plan_groups(self, groups: Mapping[Hashable, Sequence[Hashable]]) -> None:
        """Plan groups (id -> members) before their events; :meth:`open_group` gives one buffers."""
        for gid, members in groups.items():
            self._planned.plan(gid, members)

    @property
    def score_needs(self) -> dict[str, bool]:
        """The ``score_tokens`` keywords this objective needs (:func:`~thundersync_lightning.core.scoring.score_needs`)."""
        return score_needs(self.objective)

    @property
    def shapes_rewards(self) -> bool:
        """Rewards depend on their trajectory's length (overlong shaping): a reward waits for its content."""
        return self.objective.shapes_rewards

    def shaped_reward(self, reward: float, scored_tokens: int) -> float:
        return self.objective.shaped_reward(reward, scored_tokens)

    def refused_reward(self, reward: float) -> str | None:
        """Why a graded reward is refused as a failure (beyond ``max_abs_reward``), or None."""
        return self.objective.refused_reward(reward)

    @property
    def needs_step_entropy(self) -> bool:
        """``top_entropy_quantile`` < 1: scoring needs the step's entropy threshold (sync only)."""
        return self.objective.selects_tokens_by_entropy

    def step_entropy_threshold(self, entropies: Sequence[torch.Tensor]) -> float | None:
        return step_entropy_threshold(self.objective, entropies)

    def check_streamable(self) -> None:
        """Raise where the objective cannot be trained before the step's last trajectory landed."""
        if self.objective.selects_tokens_by_entropy:
            raise ConfigError(
                f"top_entropy_quantile={self.objective.top_entropy_quantile} selects tokens by a threshold over "
                "every scored token of the step, known only once the last trajectory landed; streaming and async "
                "backpropagate trajectories before that, so they cannot apply it exactly. Use mode='sync' "
                "(it runs one no-grad forward of the step first), or top_entropy_quantile=1"
            )
