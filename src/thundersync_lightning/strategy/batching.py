"""Which waiting trajectories the learner scores and backpropagates next (one call of ``add_tokens``).

Every partition of a step's trajectories into ``add_tokens`` calls yields the same gradient (the
accumulator is exact whatever the order and grouping), so this choice only moves cost:

1. **direct**: trajectories of groups whose every reward is known, across groups, in one
   forward and ONE backward (their advantages are final: no per-group sums, nothing held);
2. else the largest **(group, reward) bucket** of a group still waiting for verdicts: one
   forward, one backward into that group's two running sums;
3. else, only when the runner allows one more held gradient (no event is queued, which might make
   it ready, and fewer than ``max_held_trajectories`` are held), ONE **reward-pending**
   trajectory, the one whose content landed first (under heavy-tailed verdict latencies the
   longest waiter is the likeliest to keep waiting): its gradient is held apart until its reward
   lands, so it cannot share a backward.

One choice per call: the runner drains the queue between calls, so rewards that landed during a
backward turn partial-group buckets into direct work before they are spent in small passes.
Batches are cut at ``max_batch`` trajectories (activation memory). A batch may mix lengths freely:
the policy scores it in length-sorted micro-batches whose padding it bounds
(``GRPOPolicy(score_max_padding=...)``), so mixing groups costs forward launches, not padded compute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

__all__ = ["Batch", "BatchPath", "next_batch"]

#: Which rule above chose a batch: 1 ``direct``, 2 ``bucket``, 3 ``held``.
BatchPath = Literal["direct", "bucket", "held"]


class Batch(NamedTuple):
    path: BatchPath
    trajectories: list[str]


def next_batch(
    waiting: Sequence[str],
    rewards: Mapping[str, float],
    owner: Mapping[str, str],
    members: Mapping[str, Sequence[str]],
    max_batch: int,
    *,
    may_hold: bool,
) -> Batch | None:
    """The next trajectories to backpropagate together, and the rule that chose them (None: nothing to do now).

    Args:
        waiting: trajectories with content, not yet backpropagated, oldest first.
        rewards: the rewards known so far (trajectory id -> reward).
        owner, members: trajectory -> group, group -> its trajectories.
        max_batch: most trajectories in one call.
        may_hold: a reward-pending trajectory may be backpropagated now (its gradient held).
    """
    direct: list[str] = []
    buckets: dict[tuple[str, float], list[str]] = {}
    for tid in waiting:
        if tid not in rewards:
            continue
        gid = owner[tid]
        if all(m in rewards for m in members[gid]):
            direct.append(tid)
        else:
            buckets.setdefault((gid, rewards[tid]), []).append(tid)
    if direct:
        return Batch("direct", direct[:max_batch])
    if buckets:
        return Batch("bucket", max(buckets.values(), key=len)[:max_batch])
    if may_hold and waiting:
        return Batch("held", [waiting[0]])
    return None
