"""Exact streaming GRPO gradients: backpropagate each trajectory the moment it lands.

Notation (see :mod:`~thundersync_lightning.core.grpo.objective`): group g has trajectories i with
reward-weighted score S_i and regulariser term R_i (KL, entropy, OPD; no reward in it), scalars with an autograd
graph to the parameters theta; A_i = (a_g r_i + b_g) s; D the global normaliser.

    L = -(1/D) sum_i (A_i S_i + R_i)
    grad L = -(1/D) [ s sum_g (a_g G1_g + b_g G2_g) + sum_i grad R_i ],
    G1_g = sum r_i grad S_i,  G2_g = sum grad S_i

G1 and G2 need only each trajectory's own reward, so :meth:`add_tokens` runs the backward of S_i
at once and keeps running sums; R_i needs no reward and goes straight into the step's gradient
(held until the verdict only when failed rollouts are dropped). When a group's last verdict
lands its coefficients are known and it is *folded* into the step's gradient and its buffers
freed. :meth:`finish` (the batch barrier) applies s and 1/D and adds grad L to ``.grad``.
Parameters must not change during the step, so every gradient is taken at the same theta: zero
staleness, and the result equals one backward of L up to summation order.

Per open group the sums live in :class:`~thundersync_lightning.core.accumulator.group.GroupSums`. Advantages
are computed in float64 from the rewards directly, so a group with all-equal rewards contributes
exactly zero through S (its remaining S backward passes are skipped).

Direct path: once all verdicts of a group are known, its sums are folded at once (freeing them)
and every later trajectory of the group is backpropagated with its known advantage straight into
the step's gradient (no sums). Once anything of a group has reached the step's gradient it can no
longer be aborted (its contribution cannot be removed exactly): ``abort_group`` raises; deliver
its remaining events instead.

Dynamic sampling (``filter_groups=True``, :mod:`~thundersync_lightning.core.grpo.group_filter`): a group
whose verdicts are all in and carry no signal is *filtered*: it counts nowhere (not in D, not in
the batch moments) and nothing of it reaches the step's gradient. S_i of such a group has A_i = 0
already; R_i is summed per group (one more buffer per open group) and folded into the step only
once the group is known to be informative, so the step's gradient is the one over the kept
groups alone, exactly.

Memory is bounded by ``max_open_groups`` and ``max_held_trajectories``
(:mod:`~thundersync_lightning.core.accumulator.bounds`); a call that would pass a bound raises and changes nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import replace

import torch

from ..errors import (
    AccumulatorSpentError,
    ConfigError,
    DuplicateEventError,
    GroupError,
    InvalidLogprobError,
    OpenGroupsError,
    UnknownTrajectoryError,
)
from ..gradients.backward import BackwardBackend, ForwardWatch, LearnerCall, PlainBackward
from ..gradients.storage import ByteUsage, GradientStore, Offload
from ..grpo.group_filter import informative
from ..grpo.objective import BatchTotals, Objective
from ..grpo.terms import OnPolicyStats, TokenScores, TrajectoryTerms, trajectory_terms
from .boundary_cut import LeafSums, SharedPrefix
from .bounds import Bounds, bound_problems
from .checks import argument_problems, check_scalar, check_unchanged, finite_reward
from .group import GroupSums, release
from .jobs import jobs_of, prefix_backward, select_terms
from .report import GroupStat, StreamingReport
from .routing import check_prefix, route
from .step_gradient import StepGradient

__all__ = ["StreamingGRPO", "StreamingReport", "GroupStat"]


class StreamingGRPO:
    """Two running gradient sums per group; one exact gradient of the objective at the barrier.

    Args:
        params: the trainable tensors (``requires_grad``); ``.grad`` of nothing else is touched.
        objective: the :class:`~thundersync_lightning.core.grpo.objective.Objective` (default: GRPO,
            divided by the number of groups).
        estimator, eps: shorthands for ``Objective(estimator=..., eps=...)``.
        offload: where group sums and held gradients live (``none`` | ``cpu`` | ``pinned``); with
            both bounds set, the host buffers they allow are allocated here, not in a backward.
        max_open_groups: bound on groups declared and not yet folded/aborted (None: unbounded).
        max_held_trajectories: bound on reward-pending trajectories holding a gradient (None:
            unbounded; 0: never hold, wait for the reward before the backward).
        backend: runs each ``add_tokens`` call's backward and delivers each destination's
            gradient (:mod:`~thundersync_lightning.core.gradients.backward`; default
            :class:`~thundersync_lightning.core.gradients.backward.PlainBackward`, one backward per destination).
        filter_groups: dynamic sampling: a group without signal counts nowhere (module docstring).
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        estimator: str | None = None,
        eps: float | None = None,
        *,
        objective: Objective | None = None,
        offload: Offload = "none",
        max_open_groups: int | None = None,
        max_held_trajectories: int | None = None,
        backend: BackwardBackend | None = None,
        filter_groups: bool = False,
    ) -> None:
        self._params = [p for p in params]
        problems = argument_problems(self._params, objective is not None, estimator, eps)
        problems += bound_problems(max_open_groups, max_held_trajectories)
        if not isinstance(filter_groups, bool):
            problems.append(f"filter_groups must be True or False, got {filter_groups!r}")
        if problems:
            raise ConfigError("invalid StreamingGRPO arguments: " + "; ".join(problems))
        if objective is None:
            shorthand = {k: v for k, v in (("estimator", estimator), ("eps", eps)) if v is not None}
            objective = Objective(**shorthand)
        self.objective = objective
        self.backend: BackwardBackend = backend if backend is not None else PlainBackward()
        self.filter_groups = filter_groups
        self._bounds = Bounds(max_open_groups, max_held_trajectories)
        self._store = GradientStore(self._params, offload)
        self._store.reserve(self._bounds.buffers(objective.failed == "drop" and objective.has_regulariser_terms))
        self._step = StepGradient(self._store)
        self.reset()

    @property
    def estimator(self) -> str:
        return self.objective.estimator

    @property
    def eps(self) -> float:
        return self.objective.eps

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Start a new step: forget everything and record the parameters' version counters."""
        self._groups: dict[Hashable, GroupSums] = {}
        self._owner: dict[Hashable, Hashable] = {}
        self._folded: list[GroupStat] = []
        self._filtered: list[GroupStat] = []
        self._aborted = 0
        self._objective = 0.0
        self._regulariser = 0.0
        self._totals = BatchTotals()
        self._on_policy = OnPolicyStats()
        self._backward = 0
        self._skipped = 0
        self._step.reset()
        self._dropped_closed: dict[Hashable, bool] = {}  # dropped members of closed groups -> content seen
        self._spent = False
        self._versions = [p._version for p in self._params]
        self._store.reset_counters()
        self._bounds.reset()

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
    def groups_filtered(self) -> int:
        """Groups closed without signal under ``filter_groups`` (counted nowhere)."""
        return len(self._filtered)

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
        return self._totals

    @property
    def on_policy(self) -> OnPolicyStats:
        return self._on_policy

    def objective_parts(self) -> tuple[float, float]:
        """(sum_i A'_i S_i, sum_i R_i) over the groups closed so far (sum them over ranks)."""
        return self._objective, self._regulariser

    def needs_score(self, trajectory_id: Hashable) -> bool:
        """False for a trajectory already dropped (failed verdict, ``failed="drop"``): skip its forward."""
        if trajectory_id in self._dropped_closed:
            return False
        gid, group = self._group_of(trajectory_id)
        return trajectory_id not in group.dropped and not group.filtered

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
        self._bounds.check_open(group_id, len(self._groups))
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

    def add_reward(self, trajectory_id: Hashable, reward: float, failed: bool = False) -> None:
        """Record r_i (``failed``: the verdict failed). Folds held gradients; closes the group when complete."""
        self._check_live()
        gid, group = self._group_of(trajectory_id)
        value = finite_reward(trajectory_id, reward)
        if trajectory_id in group.rewards:
            raise DuplicateEventError(f"trajectory {trajectory_id!r} already has a reward")
        group.rewards[trajectory_id] = value
        held = group.held.pop(trajectory_id, None)
        held_reg = group.held_regulariser.pop(trajectory_id, None)
        dropping = failed and self.objective.failed == "drop"
        if group.leaves is not None:
            group.leaves.on_reward(trajectory_id, value, dropping, self._regulariser_apart)
        if dropping:
            group.dropped.add(trajectory_id)
            if trajectory_id in group.scores:
                group.scored_dropped.add(trajectory_id)
            group.scores.pop(trajectory_id, None)
            group.regulariser.pop(trajectory_id, None)
            release(self._store, held, held_reg)
        else:
            if held is not None and trajectory_id in group.flagged:
                group.add_flagged(self._store, value, held)
            elif held is not None:
                group.add_known(self._store, value, held)
            if held_reg is not None and self.filter_groups:
                group.add_regulariser(self._store, held_reg)  # the step gets it once the group is known kept
            elif held_reg is not None:
                self._step.add_flat(self._step_buffer("regulariser_now"), held_reg)
                group.direct += 1
        if group.all_rewards_known():
            if self.filter_groups:
                self._decide(group)
            self._fold_buffers(group)  # a_g, b_g are known now: free the sums early
        self._maybe_close(gid, group)
        self._count(gid)

    def add_logprob(self, trajectory_id: Hashable, logprob: torch.Tensor) -> None:
        """One trajectory's S_i (see :meth:`add_logprobs`)."""
        check_scalar(trajectory_id, logprob)
        self.add_logprobs([trajectory_id], logprob.reshape(1))

    def add_logprobs(self, trajectory_ids: Sequence[Hashable], logprobs: torch.Tensor) -> None:
        """Shorthand of :meth:`add_tokens` when S_i is the plain sum of scored-token logprobs.

        Only for objectives that need no per-token data (``loss_agg`` ``group-sum`` or
        ``seq-mean-token-sum``, no importance correction, KL or entropy).
        """
        self._check_live()
        if self.objective.needs_token_detail:
            raise ConfigError(
                f"this objective ({self.objective}) needs per-token scores; use add_tokens(ids, TokenScores)"
            )
        ids = list(trajectory_ids)
        if logprobs.dim() != 1 or logprobs.numel() != len(ids):
            raise InvalidLogprobError(
                f"add_logprobs needs a 1-D tensor with one score per trajectory id: got shape "
                f"{tuple(logprobs.shape)} for {len(ids)} ids"
            )
        zeros = torch.zeros(len(ids), dtype=torch.float64)
        self._add(ids, TrajectoryTerms(logprobs, None, zeros, OnPolicyStats()))

    def add_tokens(
        self,
        trajectory_ids: Sequence[Hashable],
        scores: TokenScores,
        engine_logprobs: torch.Tensor | None = None,
        *,
        teacher_logprobs: torch.Tensor | None = None,
        prefix: SharedPrefix | None = None,
        watch: ForwardWatch | None = None,
    ) -> None:
        """Backpropagate a scored batch now; exact same result as one call per trajectory.

        ``engine_logprobs`` ((n, L), laid out like ``scores.mask``; see
        :func:`~thundersync_lightning.core.grpo.terms.engine_logprobs`) feed the importance correction
        and the on-policy statistics; ``teacher_logprobs`` (same layout; see
        :func:`~thundersync_lightning.core.grpo.terms.teacher_logprobs`) the OPD term. Trajectories whose gradients end in the same place share ONE
        backward pass: everything with a known advantage or no reward dependence (the step's
        gradient), and the members of one group with the same known reward (one sum). A
        trajectory without a known reward gets its own backward (its gradient is held apart).

        ``prefix``: the boundary cut (:mod:`~thundersync_lightning.core.accumulator.boundary_cut`): every trajectory
        belongs to one group whose continuations were scored on these prefix leaves.

        ``watch``: what :meth:`backend.watch <thundersync_lightning.core.gradients.backward.BackwardBackend.watch>`
        gave this batch's scoring, handed back to the backend with the call's jobs.
        """
        self._check_live()
        ids = list(trajectory_ids)
        if scores.n != len(ids):
            raise InvalidLogprobError(f"add_tokens got {scores.n} scored rows for {len(ids)} trajectory ids")
        if prefix is not None and self.objective.off_policy_mask is not None:
            raise ConfigError(
                "off_policy_mask keeps flagged trajectories' gradients apart until their group's advantages "
                "are known; the boundary cut sums a group's prompt gradient before that. Turn one of them off"
            )
        terms = trajectory_terms(self.objective, scores, engine_logprobs, teacher_logprobs)
        self._add(ids, terms, prefix, watch)

    @property
    def _regulariser_apart(self) -> bool:
        """grad R_i is kept out of the s-scaled sums (only where s is global: ``scale="batch"``,
        ``is_batch_normalize``)."""
        return self.objective.scales_at_barrier

    def _add(
        self,
        ids: list[Hashable],
        terms: TrajectoryTerms,
        prefix: SharedPrefix | None = None,
        watch: ForwardWatch | None = None,
    ) -> None:
        if len(set(ids)) != len(ids):
            raise DuplicateEventError(f"add_tokens got a trajectory id twice: {ids}")
        late = [i for i, tid in enumerate(ids) if tid in self._dropped_closed]
        for i in late:  # dropped after a failed verdict, its group already closed: counts nowhere
            if self._dropped_closed[ids[i]]:
                raise DuplicateEventError(f"trajectory {ids[i]!r} already has a logprob")
        keep = [i for i in range(len(ids)) if i not in set(late)]
        rows = [ids[i] for i in keep]
        if late:
            terms = select_terms(terms, keep)
        owners = [self._group_of(tid) for tid in rows]
        routing = route(self.objective, rows, owners, terms, self.filter_groups)
        self._bounds.check_held(rows[i] for i in routing.held + routing.held_regulariser)
        if prefix is not None:
            check_prefix(owners, prefix)
        inputs = list(self._params) + (list(prefix.leaves) if prefix is not None else [])
        jobs = jobs_of(routing, rows, terms)
        label = rows[0] if len(rows) == 1 else f"{len(rows)} trajectories"
        # a destination whose coefficient is still unknown may stay deferred (on the device only)
        deferrable = [self._store.on_device and kind in ("sum", "held", "regulariser_held") for kind, _, _ in jobs]
        grads, passes = self.backend.deliver(LearnerCall(label, jobs, terms, inputs, keep, deferrable, watch))
        self._backward += passes
        # every check passed and every backward ran: now change state
        if prefix is not None and rows:
            group = owners[0][1]
            leaves = group.leaves = group.leaves or LeafSums(prefix)
            n = len(self._params)
            for (kind, key, _), g in zip(jobs, grads):
                leaves.add(kind, key, prefix.flatten(g[n:]), self._regulariser_apart)
            grads = [g[:n] for g in grads]
        for i in late:
            self._dropped_closed[ids[i]] = True
        if terms.flagged is not None:  # before the gradients land: a held one is routed by it
            for i, (tid, (_, group)) in enumerate(zip(rows, owners)):
                if bool(terms.flagged[i]):
                    group.flagged.add(tid)
        self._skipped += len(late) + routing.skipped
        for (kind, key, _), g in zip(jobs, grads):
            if kind in ("direct", "regulariser_now"):
                self._step.add_grads(self._step_buffer(kind), g)
            else:
                gid = key[0] if kind == "sum" else key if kind == "regulariser_sum" else self._owner[key]
                self._groups[gid].take(kind, key, g, self._store)
        for i in routing.touched:
            owners[i][1].direct += 1
        for i, (tid, (_, group)) in enumerate(zip(rows, owners)):
            regulariser = routing.regulariser[i] if routing.regulariser is not None else None
            weights = tuple(terms.is_weights[i].tolist()) if terms.is_weights is not None else (0.0, 0.0)
            group.record_score(tid, routing.scores[i], float(terms.tokens[i]), regulariser, weights)
        self._on_policy = self._on_policy + terms.on_policy
        touched = list({id(g): (gid, g) for gid, g in owners}.values())
        for gid, group in touched:
            if gid in self._groups:
                self._maybe_close(gid, group)
        self._count(*(gid for gid, _ in touched))

    def _count(self, *group_ids: Hashable) -> None:
        """Held gradients, deferred and leaf bytes, recounted for the groups an event touched."""
        self._store.set_side_bytes(self._bounds.recount(self._groups, group_ids, self._store.buffer_bytes))

    def abort_group(self, group_id: Hashable) -> None:
        """Drop a group that cannot finish: its buffers are freed and it counts nowhere."""
        self._check_live()
        group = self._groups.get(group_id)
        if group is None:
            raise GroupError(f"group {group_id!r} is not open (unknown, already folded or aborted)")
        if group.direct:
            raise GroupError(
                f"group {group_id!r} cannot be aborted: part of its gradient is already in the step's "
                "gradient (it cannot be removed exactly); deliver its remaining events instead"
            )
        group.drop(self._store)
        group.leaves = None
        del self._groups[group_id]
        for t in group.members:
            del self._owner[t]
        self._aborted += 1
        self._count(group_id)

    # ------------------------------------------------------------------ barrier
    def finish(self, num_groups: int | None = None, *, totals: BatchTotals | None = None) -> StreamingReport:
        """The batch barrier: add grad L to each parameter's ``.grad`` and return a report.

        ``totals``: the global counts (the sum of every rank's :meth:`totals`); by default this
        process's. ``num_groups`` overrides the group count alone (the ``group-sum`` normaliser).
        """
        self._check_live()
        if self._groups:
            raise OpenGroupsError("cannot finish the step: " + self._describe_open())
        check_unchanged(self._params, self._versions)
        if num_groups is not None and (num_groups < len(self._folded) or num_groups < 0):
            raise GroupError(f"num_groups={num_groups} is smaller than the {len(self._folded)} groups folded here")
        glob = totals if totals is not None else self._totals
        if num_groups is not None:
            glob = replace(glob, groups=float(num_groups))
        d = self.objective.denominator(glob)
        s = self.objective.batch_scale(glob)
        report = StreamingReport(
            groups_folded=len(self._folded),
            groups_aborted=self._aborted,
            groups_filtered=len(self._filtered),
            trajectories=sum(s_.size for s_ in self._folded),
            num_groups=int(glob.groups),
            objective=self._objective,
            groups=tuple(self._folded),
            peak_bytes=self._store.peak(),
            backward_passes=self._backward,
            skipped_backward_passes=self._skipped,
            regulariser=self._regulariser,
            denominator=d,
            batch_scale=s,
            totals=self._totals,
            on_policy=self._on_policy,
            dropped=sum(s_.dropped for s_ in self._folded),
            peak_held_trajectories=self._bounds.peak_held,
            peak_held_bytes=self.peak_held_bytes,
        )
        self._step.apply(self._params, s, d)
        self._spent = True
        return report

    # ------------------------------------------------------------------ internals
    def _step_buffer(self, kind: str) -> torch.Tensor:
        """The step buffer of a ``direct`` job or of R terms (``regulariser_now``: their own when s is deferred)."""
        return self._step.unscaled() if kind == "regulariser_now" and self._regulariser_apart else self._step.scaled()

    def _decide(self, group: GroupSums) -> None:
        """Dynamic sampling, every verdict in: filter a group without signal (its R sum is freed), or
        move a kept group's R sum into the step's gradient."""
        group.filtered = not informative(group.reward_tensor().tolist(), self.objective.singleton == "reward")
        if group.regulariser_sum is None:
            return
        if group.filtered:
            release(self._store, group.regulariser_sum)
        else:
            self._step.add_flat(self._step_buffer("regulariser_now"), group.regulariser_sum)
            group.direct += 1
        group.regulariser_sum = None

    def _fold_buffers(self, group: GroupSums) -> None:
        """All verdicts known: a_g, b_g are fixed, so move the group's sums into the step's gradient."""
        if group.has_sums and not group.filtered and not group.zero_advantage(self.objective):
            a, b = group.coefficients(self.objective)
            group.fold_into(self._step.scaled(), self._store, a, b)
            group.direct += 1
        group.drop(self._store)

    def _maybe_close(self, gid: Hashable, group: GroupSums) -> None:
        if not group.complete():
            return
        a, b = group.coefficients(self.objective)
        if group.filtered:  # counts nowhere: its prompt's leaf sums are dropped unused
            group.leaves = None
            del self._groups[gid]
            for t in group.dropped:
                self._dropped_closed[t] = t in group.scored_dropped
            self._filtered.append(group.close(gid, a, b).stat)
            return
        if group.leaves is not None:
            for kind, grads in prefix_backward(group.leaves, self._params, a, b):
                self._backward += 1
                self._step.add_grads(self._step_buffer(kind), grads)
            group.leaves = None
        closed = group.close(gid, a, b)
        self._objective += closed.objective
        self._regulariser += closed.regulariser
        self._totals = self._totals + closed.totals
        del self._groups[gid]
        for t in group.dropped:
            self._dropped_closed[t] = t in group.scored_dropped
        self._folded.append(closed.stat)

    def _describe_open(self) -> str:
        parts = [g.describe_missing(gid) for gid, g in self._groups.items()]
        return "; ".join(parts) + ". Deliver the missing events or abort_group() the groups that cannot finish."
