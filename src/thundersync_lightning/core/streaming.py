"""Exact streaming GRPO gradients: backpropagate each trajectory the moment it lands.

Notation (see docs and ``estimators``): group g has trajectories i with score S_i (a scalar
with an autograd graph to the parameters theta) and reward r_i; A_i = a_g r_i + b_g; N groups.

    L = -(1/N) sum_g sum_{i in g} A_i S_i
    grad L = -(1/N) sum_g [a_g G1_g + b_g G2_g],  G1_g = sum r_i grad S_i,  G2_g = sum grad S_i

G1 and G2 need only each trajectory's own reward, so ``add_logprob`` runs the backward of S_i at
once and keeps running sums; when a group's last event lands its coefficients are known and it is
*folded* into the step's gradient and its buffers freed. ``finish`` (the batch barrier) adds
grad L to ``.grad``. Parameters must not change during the step, so every gradient is taken at
the same theta: zero staleness, and the result equals one backward of L up to summation order.

Per open group the sums live in :class:`~thundersync_lightning.core.group.GroupSums` (one sum
per reward value while there are at most two, binary rewards touching one buffer per trajectory).
Advantages are computed in float64 from the rewards directly, so a group with all-equal rewards
contributes exactly zero (and its remaining backward passes are skipped); so does a group of one.

Direct path: once all rewards of a group are known, its sums are folded at once (freeing them)
and every later trajectory of the group is backpropagated with its known advantage straight into
the step's gradient (no sums). Once anything of a group has reached the step's gradient this way
it can no longer be aborted (its contribution cannot be removed exactly): ``abort_group`` raises;
deliver its remaining logprobs instead. Before that (also with all rewards known but nothing
added, or with all-equal rewards) aborting is exact.

``max_open_groups``: ``open_group`` raises :class:`OpenGroupLimitError` when that many groups are
already open (declared, not yet folded or aborted); nothing changes. The caller admits groups as
slots free up (the strategy defers a group's events until it is admitted).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from .errors import (
    AccumulatorSpentError,
    ConfigError,
    DuplicateEventError,
    GroupError,
    InvalidLogprobError,
    OpenGroupLimitError,
    OpenGroupsError,
    PolicyChangedError,
    UnknownTrajectoryError,
)
from .estimators import get_estimator
from .group import GroupSums
from .storage import ByteUsage, GradientStore, Offload
from .validation import check_scalar, finite_reward, finite_score

__all__ = ["StreamingGRPO", "StreamingReport", "GroupStat"]


@dataclass(frozen=True, slots=True)
class GroupStat:
    group_id: Hashable
    size: int
    reward_mean: float
    reward_std: float  # population std


@dataclass(frozen=True, slots=True)
class StreamingReport:
    """What the barrier folded. ``objective`` = sum_i A_i S_i over folded trajectories on this
    process, so this process's share of the loss is ``-objective / num_groups``."""

    groups_folded: int
    groups_aborted: int
    trajectories: int
    num_groups: int
    objective: float
    groups: tuple[GroupStat, ...]
    peak_bytes: ByteUsage
    backward_passes: int
    skipped_backward_passes: int


class StreamingGRPO:
    """Two running gradient sums per group; one exact GRPO gradient at the barrier.

    Args:
        params: the trainable tensors (``requires_grad``); ``.grad`` of nothing else is touched.
        estimator: a registered advantage estimator (``grpo``, ``drgrpo``, ``rloo`` or your own).
        eps: the std guard of ``grpo``.
        offload: where group sums and held gradients live (``none`` | ``cpu`` | ``pinned``).
        max_open_groups: bound on groups declared and not yet folded/aborted (None: unbounded).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        estimator: str = "grpo",
        eps: float = 1e-6,
        *,
        offload: Offload = "none",
        max_open_groups: int | None = None,
    ) -> None:
        self._params = [p for p in params]
        problems = []
        if not self._params:
            problems.append("params is empty: pass the trainable parameters")
        if any(not p.requires_grad for p in self._params):
            problems.append("every tensor in params must require grad")
        if len({id(p) for p in self._params}) != len(self._params):
            problems.append("params lists the same tensor twice")
        if not (eps >= 0 and math.isfinite(eps)):
            problems.append(f"eps must be a finite number >= 0, got {eps}")
        if max_open_groups is not None and max_open_groups < 1:
            problems.append(f"max_open_groups must be >= 1 or None, got {max_open_groups}")
        if problems:
            raise ConfigError("invalid StreamingGRPO arguments: " + "; ".join(problems))
        self._coefficients = get_estimator(estimator)
        self.estimator = estimator
        self.eps = float(eps)
        self.max_open_groups = max_open_groups
        self._store = GradientStore(self._params, offload)
        self.reset()

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Start a new step: forget everything and record the parameters' version counters."""
        self._groups: dict[Hashable, GroupSums] = {}
        self._owner: dict[Hashable, Hashable] = {}
        self._folded: list[GroupStat] = []
        self._aborted = 0
        self._objective = 0.0
        self._backward = 0
        self._skipped = 0
        self._final: torch.Tensor | None = None
        self._spent = False
        self._versions = [p._version for p in self._params]
        self._store.reset_counters()

    @property
    def open_groups(self) -> tuple[Hashable, ...]:
        return tuple(self._groups)

    @property
    def params(self) -> tuple[torch.Tensor, ...]:
        """The tensors whose ``.grad`` the barrier writes."""
        return tuple(self._params)

    @property
    def groups_folded(self) -> int:
        return len(self._folded)

    @property
    def bytes_in_use(self) -> ByteUsage:
        return self._store.current()

    @property
    def peak_bytes(self) -> ByteUsage:
        return self._store.peak()

    def _check_live(self) -> None:
        if self._spent:
            raise AccumulatorSpentError(
                "this StreamingGRPO already reached its barrier (finish); call reset() or create a "
                "new one for the next step"
            )

    # ------------------------------------------------------------------ events
    def open_group(self, group_id: Hashable, trajectory_ids: Sequence[Hashable]) -> None:
        """Declare a group and ALL its trajectories up front."""
        self._check_live()
        members = tuple(trajectory_ids)
        if not members:
            raise GroupError(f"group {group_id!r} has no trajectories; a group needs at least one")
        if group_id in self._groups or any(s.group_id == group_id for s in self._folded):
            raise GroupError(f"group {group_id!r} was already opened in this step")
        if len(set(members)) != len(members):
            raise DuplicateEventError(f"group {group_id!r} lists a trajectory id twice: {members}")
        taken = [t for t in members if t in self._owner]
        if taken:
            raise DuplicateEventError(
                f"trajectories {taken} of group {group_id!r} already belong to group "
                f"{self._owner[taken[0]]!r}; a trajectory belongs to exactly one group"
            )
        if self.max_open_groups is not None and len(self._groups) >= self.max_open_groups:
            raise OpenGroupLimitError(
                f"cannot open group {group_id!r}: {len(self._groups)} groups are open and "
                f"max_open_groups={self.max_open_groups}; fold or abort one first, or raise the limit"
            )
        self._groups[group_id] = GroupSums(members)
        for t in members:
            self._owner[t] = group_id

    def _group_of(self, trajectory_id: Hashable) -> tuple[Hashable, GroupSums]:
        gid = self._owner.get(trajectory_id)
        if gid is not None and gid not in self._groups:
            raise DuplicateEventError(
                f"trajectory {trajectory_id!r} belongs to group {gid!r}, which is already folded: every "
                "event of its group was delivered, so this one is a duplicate"
            )
        if gid is None:
            raise UnknownTrajectoryError(
                f"trajectory {trajectory_id!r} is unknown; declare it with open_group before its events"
            )
        return gid, self._groups[gid]

    def add_reward(self, trajectory_id: Hashable, reward: float) -> None:
        """Record r_i. Folds a held gradient and closes the group when it is complete."""
        self._check_live()
        gid, group = self._group_of(trajectory_id)
        value = finite_reward(trajectory_id, reward)
        if trajectory_id in group.rewards:
            raise DuplicateEventError(f"trajectory {trajectory_id!r} already has a reward")
        group.rewards[trajectory_id] = value
        held = group.held.pop(trajectory_id, None)
        if held is not None:
            group.accumulate(self._store, value, flat=held)
        if group.all_rewards_known():
            self._fold_buffers(group)  # a_g, b_g are known now: free the sums early
        self._maybe_close(gid, group)

    def add_logprob(self, trajectory_id: Hashable, logprob: torch.Tensor) -> None:
        """Run the backward of S_i now and fold or hold its gradient (see :meth:`add_logprobs`)."""
        check_scalar(trajectory_id, logprob)
        self.add_logprobs([trajectory_id], logprob.reshape(1))

    def add_logprobs(self, trajectory_ids: Sequence[Hashable], logprobs: torch.Tensor) -> None:
        """Several trajectories at once; exact same result as calling :meth:`add_logprob` for each.

        Trajectories whose gradients end in the same place share ONE backward pass: all those of
        groups whose rewards are all known (direct path, weights A_i), and those of one group with
        the same known reward (one sum H_r). Trajectories without a known reward get their own
        backward each (their gradients must be held apart). For the fewest backward passes, pass
        one such bucket per call, scored by its own forward (each backward traverses the graph
        of every score given).
        """
        self._check_live()
        ids = list(trajectory_ids)
        if logprobs.dim() != 1 or logprobs.numel() != len(ids):
            raise InvalidLogprobError(
                f"add_logprobs needs a 1-D tensor with one score per trajectory id: got shape "
                f"{tuple(logprobs.shape)} for {len(ids)} ids"
            )
        if len(set(ids)) != len(ids):
            raise DuplicateEventError(f"add_logprobs got a trajectory id twice: {ids}")
        owners = []
        for tid in ids:
            gid, group = self._group_of(tid)
            if tid in group.scores:
                raise DuplicateEventError(f"trajectory {tid!r} already has a logprob")
            owners.append((gid, group))
        scores = [finite_score(tid, logprobs[i]) for i, tid in enumerate(ids)]
        direct: list[tuple[int, float]] = []
        buckets: dict[tuple[Hashable, float], list[int]] = {}
        single: list[int] = []
        for i, (tid, (gid, group)) in enumerate(zip(ids, owners)):
            if group.all_rewards_known():
                adv = _advantage_of(self, group, group.rewards[tid])
                if adv == 0.0:
                    self._skipped += 1
                else:
                    direct.append((i, adv))
            elif tid in group.rewards:
                buckets.setdefault((gid, group.rewards[tid]), []).append(i)
            else:
                single.append(i)
        jobs: list[tuple[str, Any, torch.Tensor]] = []
        if direct:
            weights = torch.tensor([a for _, a in direct], dtype=logprobs.dtype, device=logprobs.device)
            jobs.append(("direct", [i for i, _ in direct], (logprobs[[i for i, _ in direct]] * weights).sum()))
        for key, rows in buckets.items():
            jobs.append(("sum", key, logprobs[rows].sum()))
        for i in single:
            jobs.append(("held", ids[i], logprobs[i]))
        label = ids[0] if len(ids) == 1 else f"{len(ids)} trajectories"
        grads_per_job = [
            self._grad(label, score, retain=(k < len(jobs) - 1)) for k, (_, _, score) in enumerate(jobs)
        ]
        # every check passed and every backward ran: now change state
        for (kind, key, _), grads in zip(jobs, grads_per_job):
            if kind == "direct":
                self._add_to_final(grads)
                for i in key:
                    owners[i][1].direct += 1
            elif kind == "sum":
                gid, reward = key
                self._groups[gid].accumulate(self._store, reward, grads=grads)
            else:
                self._groups[self._owner[key]].held[key] = self._store.flatten(grads)
        for i, tid in enumerate(ids):
            owners[i][1].scores[tid] = scores[i]
        for gid, group in {id(g): (gid, g) for gid, g in owners}.values():
            if gid in self._groups:
                self._maybe_close(gid, group)

    def abort_group(self, group_id: Hashable) -> None:
        """Drop a group that cannot finish: its buffers are freed and it counts nowhere."""
        self._check_live()
        group = self._groups.get(group_id)
        if group is None:
            raise GroupError(f"group {group_id!r} is not open (unknown, already folded or aborted)")
        if group.direct:
            raise GroupError(
                f"group {group_id!r} cannot be aborted: all its rewards are known and its gradient is "
                "already folded into the step's gradient (it cannot be removed exactly); deliver its "
                "remaining logprobs instead"
            )
        group.drop(self._store)
        del self._groups[group_id]
        for t in group.members:
            del self._owner[t]
        self._aborted += 1

    # ------------------------------------------------------------------ barrier
    def finish(self, num_groups: int | None = None) -> StreamingReport:
        """The batch barrier: add grad L to each parameter's ``.grad`` and return a report.

        ``num_groups`` is N, the global number of groups (data parallel); by default the number
        of groups folded on this process. Aborted groups are not counted.
        """
        self._check_live()
        if self._groups:
            raise OpenGroupsError("cannot finish the step: " + self._describe_open())
        moved = [i for i, (p, v) in enumerate(zip(self._params, self._versions)) if p._version != v]
        if moved:
            raise PolicyChangedError(
                f"{len(moved)} parameter(s) (indices {moved[:8]}) were modified in place during the step; "
                "the streamed gradients were taken at the old values, so stepping now would mix two "
                "policies. Do not change parameters between the first event and the barrier."
            )
        if num_groups is not None and (num_groups < len(self._folded) or num_groups < 0):
            raise GroupError(f"num_groups={num_groups} is smaller than the {len(self._folded)} groups folded here")
        n = len(self._folded) if num_groups is None else num_groups
        if self._final is not None and n > 0:
            scale = -1.0 / n
            for p, g in zip(self._params, self._store.split(self._final)):
                contribution = (g * scale).to(p.dtype)
                if p.grad is None:
                    p.grad = contribution.clone()
                else:
                    p.grad.add_(contribution)
        else:
            # Nothing to add (e.g. every group had equal rewards): a zero gradient, as a synchronous
            # loss.backward() would leave, so optimizers apply momentum/weight decay the same way.
            for p in self._params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        report = StreamingReport(
            groups_folded=len(self._folded),
            groups_aborted=self._aborted,
            trajectories=sum(s.size for s in self._folded),
            num_groups=n,
            objective=self._objective,
            groups=tuple(self._folded),
            peak_bytes=self._store.peak(),
            backward_passes=self._backward,
            skipped_backward_passes=self._skipped,
        )
        if self._final is not None:
            self._store.release_device(self._final)
            self._final = None
        self._spent = True
        return report

    # ------------------------------------------------------------------ internals
    def _grad(self, trajectory_id: Hashable, logprob: torch.Tensor, retain: bool = False) -> list:
        try:
            grads = torch.autograd.grad(logprob, self._params, allow_unused=True, retain_graph=retain)
        except RuntimeError as err:
            raise InvalidLogprobError(
                f"backward of trajectory {trajectory_id!r}'s logprob failed ({err}); it must be a scalar "
                "computed from the parameters in this step's graph"
            ) from err
        if all(g is None for g in grads):
            raise InvalidLogprobError(
                f"trajectory {trajectory_id!r}'s logprob has no autograd path to the parameters; "
                "compute it from the policy's forward pass"
            )
        self._backward += 1
        return list(grads)

    def _add_to_final(self, grads: list) -> None:
        if self._final is None:
            self._final = self._store.zeros_on_device()
        for view, g in zip(self._store.split(self._final), grads):
            if g is not None:
                view.add_(g.to(view.dtype))

    def _fold_buffers(self, group: GroupSums) -> None:
        """All rewards known: a_g, b_g are fixed, so move the group's sums into the step's gradient."""
        if group.has_sums and not group.zero_advantage():
            a, b = self._coefficients(group.reward_tensor(), self.eps)
            if self._final is None:
                self._final = self._store.zeros_on_device()
            group.fold_into(self._final, self._store, a, b)
            group.direct += 1
        group.drop(self._store)

    def _maybe_close(self, gid: Hashable, group: GroupSums) -> None:
        if not group.complete():
            return
        rewards = group.reward_tensor()
        if not group.zero_advantage():
            a, b = self._coefficients(rewards, self.eps)
            self._objective += sum((a * group.rewards[t] + b) * group.scores[t] for t in group.members)
        del self._groups[gid]
        self._folded.append(
            GroupStat(gid, len(group.members), float(rewards.mean()), float(rewards.std(correction=0)))
        )

    def _describe_open(self) -> str:
        parts = []
        for gid, g in self._groups.items():
            no_reward = [t for t in g.members if t not in g.rewards]
            no_logprob = [t for t in g.members if t not in g.scores]
            parts.append(f"group {gid!r} misses rewards of {no_reward} and logprobs of {no_logprob}")
        return "; ".join(parts) + ". Deliver the missing events or abort_group() the groups that cannot finish."


def _advantage_of(acc: StreamingGRPO, group: GroupSums, reward: float) -> float:
    if group.zero_advantage():
        return 0.0
    a, b = acc._coefficients(group.reward_tensor(), acc.eps)
    return a * reward + b
