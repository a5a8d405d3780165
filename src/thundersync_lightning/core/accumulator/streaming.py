"""Exact streaming GRPO gradients: backpropagate each trajectory the moment it lands.

Notation (see :mod:`~thundersync_lightning.core.grpo.objective`): group g has trajectories i with
reward-weighted score S_i and regulariser term R_i (KL, entropy, OPD; no reward in it), scalars with an
autograd graph to the parameters theta; A_i = (a_g r_i + b_g) s; D the global normaliser.

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
(:mod:`~thundersync_lightning.core.accumulator.bounds`); a call that would pass a
bound raises and changes nothing.

Queries (the class's last section) are read-only: its bounds and usage, its counts so far, the
step's planned groups (members, owners, dropped members, informative groups) and what scoring
needs. The learner reads no ``Objective`` field: each question the step's work asks is one of these.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import replace

import torch

from ..errors import (
    AccumulatorSpentError,
    ConfigError,
    DuplicateEventError,
    GroupError,
    InvalidLogprobError,
    InvalidRewardError,
    OpenGroupsError,
    UnknownTrajectoryError,
)
from ..gradients.backward import BackwardBackend, ForwardWatch, LearnerCall, PlainBackward
from ..gradients.storage import ByteUsage, GradientStore, Offload
from ..grpo.objective import BatchTotals, Objective
from ..grpo.terms import OnPolicyStats, TokenScores, TrajectoryTerms, trajectory_terms
from ..scoring import score_needs, scored_inputs, step_entropy_threshold
from ..types import Trajectory
from .boundary_cut import SharedPrefix
from .bounds import AccumulatorBounds, Bounds
from .checks import argument_problems, check_scalar, check_unchanged, finite_reward
from .group import GroupSums
from .jobs import jobs_of, prefix_backward, select_terms
from .ledger import StepLedger
from .report import GroupStat, StreamingReport
from .routing import check_prefix, route
from .step_gradient import StepGradient
from .step_groups import StepGroups

__all__ = ["StreamingGRPO", "StreamingReport", "GroupStat"]


class StreamingGRPO:
    """Two running gradient sums per group; one exact gradient of the objective at the barrier.

    Events: :meth:`open_group`, :meth:`add_tokens` (or :meth:`add_scored`: a module's scores, the
    objective's options applied by ``core/scoring.py``), :meth:`add_reward`, :meth:`abort_group`,
    :meth:`finish`. What a learner may ask (bounds, counts, the step's planned groups, what scoring
    needs): the read-only queries at the end of the class.

    Args:
        params: the trainable tensors (``requires_grad``); ``.grad`` of nothing else is touched.
        objective: the :class:`~thundersync_lightning.core.grpo.objective.Objective` (default: GRPO,
            divided by the number of groups).
        estimator, eps: shorthands for ``Objective(estimator=..., eps=...)``.
        offload: where group sums and held gradients live (``none`` | ``cpu`` | ``pinned``); with
            both bounds set, the host buffers they allow are allocated here, not in a backward.
        bounds: the memory bounds (:class:`~thundersync_lightning.core.accumulator.bounds.AccumulatorBounds`,
            default: unbounded); the two below are its shorthands.
        max_open_groups: bound on groups declared and not yet folded/aborted (None: unbounded).
        max_held_trajectories: bound on reward-pending trajectories holding a gradient (None:
            unbounded; 0: never hold, wait for the reward before the backward).
        backend: runs each ``add_tokens`` call's backward and delivers each destination's
            gradient (:mod:`~thundersync_lightning.core.gradients.backward`; default
            :class:`~thundersync_lightning.core.gradients.backward.PlainBackward`,
            one backward per destination).
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
        bounds: AccumulatorBounds | None = None,
    ) -> None:
        self._params = [p for p in params]
        problems = argument_problems(self._params, objective is not None, estimator, eps)
        if bounds is not None and (max_open_groups, max_held_trajectories) != (None, None):
            problems.append(
                "give bounds or its shorthands (max_open_groups, max_held_trajectories), not both"
            )
        elif bounds is None:
            try:
                bounds = AccumulatorBounds(max_open_groups, max_held_trajectories)
            except ConfigError as err:
                problems.append(str(err))
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
        assert bounds is not None  # else a problem was raised above
        self._bounds = Bounds(bounds)
        self._store = GradientStore(self._params, offload)
        self._store.reserve(
            self._bounds.buffers(objective.failed == "drop" and objective.has_regulariser_terms)
        )
        self._step = StepGradient(self._store)
        self.reset()

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Start a new step: forget everything and record the parameters' version counters."""
        self._groups: dict[Hashable, GroupSums] = {}
        self._owner: dict[Hashable, Hashable] = {}
        self._ledger = StepLedger()
        self._planned = StepGroups(self.objective)
        self._step.reset()
        self._spent = False
        self._versions = [p._version for p in self._params]
        self._store.reset_counters()
        self._bounds.reset()

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
        if group_id in self._groups or self._ledger.was_folded(group_id):
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

    def add_reward(
        self,
        trajectory_id: Hashable,
        reward: float,
        failed: bool = False,
        *,
        host_fault: bool | None = None,
        unscorable: bool = False,
    ) -> None:
        """Record a verdict; folds held gradients; closes the group when complete.

        ``failed``: the verdict failed (``reward`` is then ignored): the member scores the failure
        floor (:meth:`Objective.failure_floor`), or, when ``host_fault`` (default: ``failed``)
        and ``failed="drop"``, leaves its group. ``unscorable``: every reward declined it (out
        of its group's statistics, advantage 0). A graded ``reward`` must be finite, within
        ``max_abs_reward`` and not below a configured ``failure_reward``
        (:class:`InvalidRewardError`; callers refuse such verdicts as failures first).
        """
        self._check_live()
        gid, group = self._group_of(trajectory_id)
        if group.has_verdict(trajectory_id):
            raise DuplicateEventError(f"trajectory {trajectory_id!r} already has a reward")
        obj = self.objective
        host_fault = failed if host_fault is None else host_fault
        dropping = failed and host_fault and obj.failed == "drop"
        floored = failed and not dropping and obj.failure_reward is None
        if failed or unscorable:
            value = obj.failure_reward if failed and obj.failure_reward is not None else 0.0
        else:
            value = finite_reward(trajectory_id, reward)
            refused = obj.refused_reward(value)
            if refused is not None:
                raise InvalidRewardError(f"trajectory {trajectory_id!r}: {refused}")
            if obj.failure_reward is not None and value < obj.failure_reward:
                raise InvalidRewardError(
                    f"reward {value!r} of trajectory {trajectory_id!r} is below Objective.failure_reward="
                    f"{obj.failure_reward!r}: a failure would outscore it. Set failure_reward below every "
                    "reward the task can give (overlong_penalty included), or None (the "
                    "worst graded reward of the group)"
                )
        to_step = group.add_reward(
            trajectory_id,
            value,
            dropping,
            self._store,
            self._regulariser_apart,
            self.filter_groups,
            floored=floored,
            unscorable=unscorable and not failed,
        )
        if to_step is not None:
            self._step.add_flat(self._step_buffer("regulariser_now"), to_step)
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
        :func:`~thundersync_lightning.core.grpo.terms.teacher_logprobs`) the OPD term. Trajectories whose
        gradients end in the same place share ONE backward pass: everything with a known advantage or no
        reward dependence (the step's gradient), and the members of one group with the same known reward (one
        sum). A trajectory without a known reward gets its own backward (its gradient is held apart).

        ``prefix``: the boundary cut (:mod:`~thundersync_lightning.core.accumulator.boundary_cut`): every
        trajectory belongs to one group whose continuations were scored on these prefix leaves.

        ``watch``: what :meth:`backend.watch
        <thundersync_lightning.core.gradients.backward.BackwardBackend.watch>` gave this batch's scoring,
        handed back to the backend with the call's jobs.
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

    def add_scored(
        self,
        trajectories: Sequence[Trajectory],
        scores: TokenScores,
        *,
        entropy_threshold: float | None = None,
        prefix: SharedPrefix | None = None,
        watch: ForwardWatch | None = None,
    ) -> None:
        """:meth:`add_tokens` of a module's scores of ``trajectories``, the objective's options
        applied by the core's one recipe (:func:`~thundersync_lightning.core.scoring.scored_inputs`)."""
        scores, engine, teacher = scored_inputs(self.objective, trajectories, scores, entropy_threshold)
        ids = [t.trajectory_id for t in trajectories]
        self.add_tokens(ids, scores, engine, teacher_logprobs=teacher, prefix=prefix, watch=watch)

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
        late = [i for i, tid in enumerate(ids) if tid in self._ledger.dropped_closed]
        for i in late:  # dropped after a failed verdict, its group already closed: counts nowhere
            if self._ledger.dropped_closed[ids[i]]:
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
        deferrable = [self._store.on_device and job.destination.deferrable for job in jobs]
        grads, passes = self.backend.deliver(LearnerCall(label, jobs, terms, inputs, keep, deferrable, watch))
        self._ledger.backward_passes += passes
        # every check passed and every backward ran: now change state
        if prefix is not None and rows:
            leaves = owners[0][1].leaf_sums(prefix)
            n = len(self._params)
            for job, g in zip(jobs, grads):
                leaves.add(job.destination, prefix.flatten(g[n:]), self._regulariser_apart)
            grads = [g[:n] for g in grads]
        for i in late:
            self._ledger.dropped_closed[ids[i]] = True
        if terms.flagged is not None:  # before the gradients land: a held one is routed by it
            for i, (tid, (_, group)) in enumerate(zip(rows, owners)):
                if bool(terms.flagged[i]):
                    group.flag(tid)
        self._ledger.skipped += len(late) + routing.skipped
        for job, g in zip(jobs, grads):
            dest = job.destination
            if dest.to_step:
                self._step.add_grads(self._step_buffer(dest.kind), g)
            else:
                gid = dest.group if dest.group is not None else self._owner[dest.trajectory]
                self._groups[gid].take(dest, g, self._store)
        for i in routing.touched:
            owners[i][1].touch_step()
        for i, (tid, (_, group)) in enumerate(zip(rows, owners)):
            regulariser = routing.regulariser[i] if routing.regulariser is not None else None
            weights = tuple(terms.is_weights[i].tolist()) if terms.is_weights is not None else (0.0, 0.0)
            group.record_score(tid, routing.scores[i], float(terms.tokens[i]), regulariser, weights)
        self._ledger.on_policy = self._ledger.on_policy + terms.on_policy
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
        if group.reached_step:
            raise GroupError(
                f"group {group_id!r} cannot be aborted: part of its gradient is already in the step's "
                "gradient (it cannot be removed exactly); deliver its remaining events instead"
            )
        group.drop(self._store)
        group.drop_leaves()
        del self._groups[group_id]
        for t in group.members:
            del self._owner[t]
        self._ledger.aborted += 1
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
        folded = len(self._ledger.folded)
        if num_groups is not None and (num_groups < folded or num_groups < 0):
            raise GroupError(f"num_groups={num_groups} is smaller than the {folded} groups folded here")
        glob = totals if totals is not None else self._ledger.totals
        if num_groups is not None:
            glob = replace(glob, groups=float(num_groups))
        d = self.objective.denominator(glob)
        s = self.objective.batch_scale(glob)
        held = (self._bounds.peak_held, self.peak_held_bytes)
        report = self._ledger.report(glob, d, s, self._store.peak(), held)
        self._step.apply(self._params, s, d)
        self._spent = True
        return report

    # ------------------------------------------------------------------ internals
    def _step_buffer(self, kind: str) -> torch.Tensor:
        """The step buffer of a ``direct`` job or of R terms
        (``regulariser_now``: their own when s is deferred)."""
        return (
            self._step.unscaled()
            if kind == "regulariser_now" and self._regulariser_apart
            else self._step.scaled()
        )

    def _decide(self, group: GroupSums) -> None:
        """Dynamic sampling, every verdict in: a kept group's R sum joins the step's gradient."""
        kept = group.decide(self.objective, self._store)
        if kept is not None:
            self._step.add_flat(self._step_buffer("regulariser_now"), kept)

    def _fold_buffers(self, group: GroupSums) -> None:
        """All verdicts known: a_g, b_g are fixed, so move the group's sums into the step's gradient."""
        group.fold(self.objective, self._step.scaled, self._store)

    def _maybe_close(self, gid: Hashable, group: GroupSums) -> None:
        if not group.complete():
            return
        a, b = group.coefficients(self.objective)
        if group.leaves is not None and not group.filtered:  # a filtered group's leaf sums go unused
            for kind, grads in prefix_backward(group.leaves, self._params, a, b, group.floor()):
                self._ledger.backward_passes += 1
                self._step.add_grads(self._step_buffer(kind), grads)
        group.drop_leaves()
        del self._groups[gid]
        self._ledger.close(gid, group, a, b)

    def _describe_open(self) -> str:
        parts = [g.describe_missing(gid) for gid, g in self._groups.items()]
        return (
            "; ".join(parts) + ". Deliver the missing events or abort_group() the groups that cannot finish."
        )

    # ================================================================== queries (read-only)
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
        """The ``score_tokens`` keywords this objective needs
        (:func:`~thundersync_lightning.core.scoring.score_needs`)."""
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
                f"top_entropy_quantile={self.objective.top_entropy_quantile} selects tokens by a threshold "
                "over every scored token of the step, known only once the last trajectory landed; streaming "
                "and async backpropagate trajectories before that, so they cannot apply it exactly. Use "
                "mode='sync' (it runs one no-grad forward of the step first), or top_entropy_quantile=1"
            )
