"""Where each scored trajectory's gradient goes: the backward passes of one ``add_tokens`` call.

For trajectory i of open group g (notation of :mod:`~thundersync_lightning.core.accumulator.streaming`):

- every verdict of g known: A_i is known, so A_i S_i goes to the step's gradient (*direct*);
- its own reward known, others pending: S_i joins the sum of its (group, reward) *bucket* (a
  flagged trajectory, ``off_policy_mask``, a bucket of its own: folded with max(A, 0)); a floored
  failure (reward f_g, known at the group's last verdict) the bucket of reward ``None``;
- an unscorable member (advantage 0): no S_i backward;
- its reward pending: grad S_i is *held* apart until the reward arrives;
- a dropped member (failed verdict, ``failed="drop"``): nothing;
- R_i goes to the step's gradient at once (one backward with the direct terms; a separate one
  when the batch scale s must not touch it), or is held until the verdict under ``failed="drop"``;
  with dynamic sampling (``filter_groups``) it goes to its group's R sum until every verdict of
  the group is in (an uninformative group's R must never reach the step);
- a member of a filtered group (every verdict in, no signal): nothing.

Everything that ends in the same place shares one backward. Routing only reads state: it raises
on a duplicate before anything changes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from ..errors import DuplicateEventError, GroupError
from ..grpo.objective import Objective
from ..grpo.terms import TrajectoryTerms
from .boundary_cut import SharedPrefix
from .checks import finite_score
from .destination import Destination
from .group import GroupSums

__all__ = ["Routing", "route", "check_prefix"]


@dataclass
class Routing:
    """Row indices and scalar terms of one scored batch, by destination."""

    scores: list[float]  # S_i values (checked finite)
    regulariser: list[float] | None  # R_i values
    direct: list[torch.Tensor] = field(default_factory=list)  # -> step gradient (s-scaled)
    direct_regulariser: list[torch.Tensor] = field(default_factory=list)  # -> step gradient, unscaled
    buckets: dict[Destination, list[int]] = field(default_factory=dict)  # group sums by reward
    held: list[int] = field(default_factory=list)
    held_regulariser: list[int] = field(default_factory=list)
    group_regulariser: dict[Hashable, list[int]] = field(default_factory=dict)  # rows -> their group's R sum
    touched: set[int] = field(default_factory=set)  # rows that reach the step gradient now
    skipped: int = 0  # rows that need no backward at all


def route(
    objective: Objective,
    ids: Sequence[Hashable],
    owners: Sequence[tuple[Hashable, GroupSums]],
    terms: TrajectoryTerms,
    filter_groups: bool = False,
) -> Routing:
    score, reg = terms.score, terms.regulariser
    for tid, (_, group) in zip(ids, owners):
        if group.is_scored(tid):
            raise DuplicateEventError(f"trajectory {tid!r} already has a logprob")
    routing = Routing(
        scores=[finite_score(tid, score[i]) for i, tid in enumerate(ids)],
        regulariser=[finite_score(tid, reg[i]) for i, tid in enumerate(ids)] if reg is not None else None,
    )
    batch = objective.scales_at_barrier
    drop = objective.failed == "drop"
    for i, (tid, (gid, group)) in enumerate(zip(ids, owners)):
        if group.is_dropped(tid) or group.filtered:
            routing.skipped += 1
            continue
        verdict = group.has_verdict(tid)
        r_term = reg[i] if reg is not None else None
        flagged = terms.flagged is not None and bool(terms.flagged[i])
        if group.all_rewards_known():
            adv = group.advantage(objective, tid)
            if flagged and adv < 0:
                adv = 0.0
            if adv != 0.0:
                routing.direct.append(score[i] * adv)
                routing.touched.add(i)
            elif r_term is None:
                routing.skipped += 1
        elif group.zero_advantage(objective) or group.is_unscorable(tid):
            routing.skipped += r_term is None
        elif verdict:
            routing.buckets.setdefault(Destination.group_sum(gid, group.reward_of(tid), flagged), []).append(
                i
            )
        else:
            routing.held.append(i)
        if r_term is not None:
            if drop and not verdict:
                routing.held_regulariser.append(i)
            elif filter_groups and not group.all_rewards_known():
                routing.group_regulariser.setdefault(gid, []).append(i)
            else:
                (routing.direct_regulariser if batch else routing.direct).append(r_term)
                routing.touched.add(i)
    return routing


def check_prefix(owners: Sequence[tuple[Hashable, GroupSums]], prefix: SharedPrefix) -> None:
    """A shared prefix (boundary cut) belongs to exactly one group, and a group to one prefix."""
    if not owners:
        return
    gids = sorted({gid for gid, _ in owners}, key=str)
    if len(gids) != 1:
        raise GroupError(f"a shared prefix belongs to one group; add_tokens got trajectories of {gids}")
    leaves = owners[0][1].leaves
    if leaves is not None and leaves.prefix is not prefix:
        raise GroupError(f"group {gids[0]!r} already has another shared prefix; score its members on one")
