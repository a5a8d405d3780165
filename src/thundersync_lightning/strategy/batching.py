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

Those are the places a call's gradients go, its *destinations*, in order of preference: the direct
rows, then every bucket (largest first), then the reward-pending rows oldest first (each a
destination of its own). A call takes the first ``destinations`` of them: one with the plain
backward backend (one backward per destination), more with a backend that serves several in one
backward (:attr:`~thundersync_lightning.core.gradients.backward.BackwardBackend.destinations`). Its path
names the first rule that contributed.

One choice per call: the runner drains the queue between calls, so rewards that landed during a
backward turn partial-group buckets into direct work before they are spent in small passes.
Batches are cut at ``max_batch`` trajectories and, given ``max_tokens``, at the longest prefix of
the chosen order whose tokens sum to at most ``max_tokens`` (always one trajectory, however long:
a trajectory cannot be cut): activation memory grows with tokens, not rows (verl's
``ppo_max_token_len_per_gpu`` under ``use_dynamic_bsz``). A batch may mix lengths freely:
the policy scores it in length-sorted micro-batches whose padding it bounds
(``GRPOPolicy(score_max_padding=...)``), so mixing groups costs forward launches, not padded compute.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal, NamedTuple

__all__ = ["Batch", "BatchPath", "next_batch", "count_destinations", "call_size"]

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
    hold: int,
    destinations: int = 1,
    lengths: Mapping[str, int] | None = None,
    max_tokens: int | None = None,
) -> Batch | None:
    """The next trajectories to backpropagate together, and the rule that chose
    them (None: nothing to do now).

    Args:
        waiting: trajectories with content, not yet backpropagated, oldest first.
        rewards: the rewards known so far (trajectory id -> reward).
        owner, members: trajectory -> group, group -> its trajectories.
        max_batch: most trajectories in one call.
        hold: the most reward-pending trajectories the call may take now (their gradients are
            held; 0: none).
        destinations: the most destinations the call may span (module docstring).
        lengths, max_tokens: the tokens each trajectory runs forward, and the most of them in one
            call (None: no token bound; ``lengths`` is then not needed).
    """

    def cut(chosen: list[str]) -> list[str]:
        if max_tokens is None:
            return chosen[:max_batch]
        assert lengths is not None, "max_tokens needs lengths"
        return chosen[: call_size([lengths[t] for t in chosen[:max_batch]], max_batch, max_tokens)]

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
    pending = [t for t in waiting if t not in rewards][: max(0, hold)]
    # sorted() is stable: equal buckets keep their order, so the largest is the first of the largest
    places = (
        ([direct] if direct else [])
        + sorted(buckets.values(), key=len, reverse=True)
        + [[t] for t in pending]
    )
    chosen = [t for place in places[: max(1, destinations)] for t in place]
    path: BatchPath = "direct" if direct else "bucket" if buckets else "held"
    return Batch(path, cut(chosen)) if chosen else None


def count_destinations(
    batch: Sequence[str],
    rewards: Mapping[str, float],
    owner: Mapping[str, str],
    members: Mapping[str, Sequence[str]],
) -> int:
    """How many places a batch's gradients go: the step's gradient (rows of fully rewarded
    groups), one sum per (group, reward), one held gradient per reward-pending row."""
    places: set[object] = set()
    for tid in batch:
        gid = owner[tid]
        if tid not in rewards:
            places.add(("held", tid))
        elif all(m in rewards for m in members[gid]):
            places.add("direct")
        else:
            places.add((gid, rewards[tid]))
    return len(places)


def call_size(lengths: Sequence[int], max_batch: int, max_tokens: int | None = None) -> int:
    """How many of the first trajectories (their token ``lengths``, in order) one call takes: at
    most ``max_batch``, and the longest prefix whose tokens sum to at most ``max_tokens``, but
    never none (a trajectory longer than ``max_tokens`` goes alone)."""
    n = min(len(lengths), max_batch)
    if max_tokens is None:
        return n
    total = 0
    for k in range(n):
        total += lengths[k]
        if total > max_tokens and k > 0:
            return k
    return n
