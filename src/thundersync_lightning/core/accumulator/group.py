"""One open group's state in the streaming accumulator: rewards, held gradients and the sums.

While a group has seen at most two distinct reward values it keeps one gradient sum per value
(binary rewards: P = sum_{r=1} grad S_i, Z = sum_{r=0} grad S_i: one buffer touched per
trajectory). A third distinct value collapses them into

    G1 = sum_i (r_i - c) grad S_i,    G2 = sum_i grad S_i

with c one of the group's rewards, so that the fold a_g G1 + (a_g c + b_g) G2 does not suffer the
cancellation a_g sum r_i g + b_g sum g has when rewards share a large offset. G1 is kept divided by
a power of two z >= every |r_i| seen beyond 2^20 (z = 1 below: then nothing changes), exact, so
that no finite reward overflows it. A gradient whose
reward is not yet known is held apart until it is (and, when failed rollouts are dropped, so is the
gradient of its regulariser term R_i). A *dropped* member (failed verdict, ``failed="drop"``)
leaves the group: its held gradients are freed and it counts nowhere.

A *floored* member (a failure scored at the worst graded reward of its group, the objective's
failure floor f_g) has a verdict but no reward until the group's last verdict lands: its gradient
joins one more sum, F = sum_{floored} grad S_i, folded with a_g f_g + b_g (one buffer per group
that has one, whatever its number of failures). An *unscorable* member (every reward declined it)
has advantage 0: its S_i gradient is never formed (a held one is freed), its R_i trains, and it
leaves the group's statistics but not its counts.

A backward backend may deliver a gradient as a
:class:`~thundersync_lightning.core.gradients.deferred.DeferredGradient` (formed at the fold). Reward-known
deferred gradients are kept, one per delivery, while they take no more bytes than the dense sums
they stand for (one buffer per distinct reward, at most two) and the group has no dense sum;
otherwise they are formed into the dense sums (*spilled*). A held gradient may be deferred too
(never more bytes than a buffer). So a group never takes more bytes than it would with dense
gradients alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from ..gradients.deferred import DeferredGradient, fold_deferred
from ..gradients.storage import GradientStore
from ..grpo.group_filter import informative
from ..grpo.objective import BatchTotals, Objective
from .boundary_cut import LeafSums, SharedPrefix
from .destination import Destination
from .report import GroupStat

__all__ = ["GroupSums", "GroupUsage", "ClosedGroup"]


class GroupUsage(NamedTuple):
    held: int  # trajectories holding a gradient until their reward (or verdict)
    held_bytes: int  # of those held gradients
    side_bytes: int  # outside the store's flat buffers: deferred gradients and boundary-cut leaf sums


@dataclass(frozen=True, slots=True)
class ClosedGroup:
    """What a complete group adds to the step's objective parts, counts and report."""

    objective: float  # sum_i A'_i S_i over kept members (before the batch scale s)
    regulariser: float  # sum_i R_i over kept members
    totals: BatchTotals
    stat: GroupStat


@dataclass
class GroupSums:
    members: tuple[Hashable, ...]
    _rewards: dict[Hashable, float] = field(default_factory=dict)
    _scores: dict[Hashable, float] = field(default_factory=dict)  # S_i values, for the objective
    _held: dict[Hashable, torch.Tensor | DeferredGradient] = field(
        default_factory=dict
    )  # grads awaiting their reward
    _held_regulariser: dict[Hashable, torch.Tensor | DeferredGradient] = field(
        default_factory=dict
    )  # grad R_i awaiting its verdict
    _regulariser: dict[Hashable, float] = field(default_factory=dict)  # R_i values, for the objective
    _tokens: dict[Hashable, float] = field(default_factory=dict)  # scored-token counts
    _is_weights: dict[Hashable, tuple[float, float]] = field(default_factory=dict)  # IS weight (sum, count)
    _dropped: set[Hashable] = field(default_factory=set)  # failed members removed from the group
    _floored: set[Hashable] = field(default_factory=set)  # failures scored at the group's worst graded reward
    _unscorable: set[Hashable] = field(default_factory=set)  # every reward declined them: advantage 0
    _floor_sum: torch.Tensor | None = None  # F = sum of floored members' grad S_i
    _scored_dropped: set[Hashable] = field(default_factory=set)  # dropped members whose content came
    _leaves: LeafSums | None = None  # boundary cut: sums at the shared prompt's leaves
    _by_reward: dict[float, torch.Tensor] = field(default_factory=dict)  # <= 2 distinct reward values
    _g1: torch.Tensor | None = None  # sum (r_i - shift) grad S_i, after collapse
    _g2: torch.Tensor | None = None  # sum grad S_i, after collapse
    _shift: float = 0.0
    _scale: float = 1.0  # z: G1 holds sum (r_i - c) / z grad S_i (module docstring)
    _deferred: list[tuple[float, DeferredGradient]] = field(
        default_factory=list
    )  # reward-known (reward, gradient)
    _direct: int = 0  # contributions already added to the step gradient (early fold or direct path)
    _flagged: set[Hashable] = field(
        default_factory=set
    )  # off_policy_mask: members whose A counts only if >= 0
    _flagged_sums: dict[float | None, torch.Tensor] = field(default_factory=dict)  # their gradients by reward
    _regulariser_sum: torch.Tensor | None = (
        None  # dynamic sampling: sum of grad R_i until the group is known informative
    )
    _filtered: bool = False  # dynamic sampling: every verdict in and no signal: the group counts nowhere
    _final: tuple[Objective, tuple[float, float]] | None = None  # (a_g, b_g) once every verdict is in

    # ------------------------------------------------------------------ what others may read
    def has_verdict(self, trajectory_id: Hashable) -> bool:
        return trajectory_id in self._rewards

    def reward_of(self, trajectory_id: Hashable) -> float | None:
        """The reward it trains on once known: its graded reward, or a floored member's f_g once every
        verdict is in; None while pending and for an unscorable member."""
        if trajectory_id in self._unscorable:
            return None
        if trajectory_id in self._floored:
            return self.floor() if self.all_rewards_known() else None
        return self._rewards.get(trajectory_id)

    def is_unscorable(self, trajectory_id: Hashable) -> bool:
        return trajectory_id in self._unscorable

    def floor(self) -> float:
        """f_g from the graded rewards known so far (final once every verdict is in): the worst of
        them, 0.0 with none (the group's failures are then all equal)."""
        graded = [
            r
            for t, r in self._rewards.items()
            if not (t in self._floored or t in self._unscorable or t in self._dropped)
        ]
        return min(graded) if graded else 0.0

    def advantage(self, objective: Objective, trajectory_id: Hashable) -> float:
        """A_i / s once every verdict is in (0 for an unscorable member)."""
        reward = self.reward_of(trajectory_id)
        if reward is None:
            return 0.0
        a, b = self.coefficients(objective)
        return a * reward + b

    def is_scored(self, trajectory_id: Hashable) -> bool:
        """Its S_i was recorded (a dropped member: its content came)."""
        return trajectory_id in self._scores or trajectory_id in self._scored_dropped

    def is_dropped(self, trajectory_id: Hashable) -> bool:
        return trajectory_id in self._dropped

    def dropped_members(self) -> dict[Hashable, bool]:
        """Dropped member -> whether its content came."""
        return {t: t in self._scored_dropped for t in self._dropped}

    @property
    def filtered(self) -> bool:
        """Dynamic sampling: every verdict in and no signal: the group counts nowhere."""
        return self._filtered

    @property
    def reached_step(self) -> bool:
        """Part of its gradient is in the step's gradient already (it can no longer be aborted)."""
        return self._direct > 0

    @property
    def leaves(self) -> LeafSums | None:
        """The boundary cut's sums at the shared prompt's leaves (None: no cut, or dropped)."""
        return self._leaves

    # ------------------------------------------------------------------ transitions
    def flag(self, trajectory_id: Hashable) -> None:
        """``off_policy_mask``: the member's advantage counts only where it is >= 0."""
        self._flagged.add(trajectory_id)

    def touch_step(self) -> None:
        """Something of the group was added to the step's gradient."""
        self._direct += 1

    def leaf_sums(self, prefix: SharedPrefix) -> LeafSums:
        """The boundary cut's leaf sums, created on first use."""
        if self._leaves is None:
            self._leaves = LeafSums(prefix)
        return self._leaves

    def drop_leaves(self) -> None:
        self._leaves = None

    def kept(self) -> tuple[Hashable, ...]:
        return tuple(t for t in self.members if t not in self._dropped)

    def complete(self) -> bool:
        """Every verdict known and every kept member scored."""
        return self.all_rewards_known() and all(t in self._scores for t in self.kept())

    def all_rewards_known(self) -> bool:
        return len(self._rewards) == len(self.members)

    def coefficients(self, objective: Objective) -> tuple[float, float]:
        """(a_g, b_g) once every verdict is known (zero when every A_i is exactly 0); computed once:
        with every verdict in, neither the rewards nor the dropped members can change."""
        if self._final is not None and self._final[0] is objective:
            return self._final[1]
        value = objective.coefficients(self.reward_tensor())
        if self.all_rewards_known():
            self._final = (objective, value)
        return value

    def zero_advantage(self, objective: Objective) -> bool:
        """Every A_i is exactly 0: known once all verdicts are in, or up front
        (lone member, reward_coef 0)."""
        if objective.reward_coef == 0:
            return True
        if self.all_rewards_known():
            return self.coefficients(objective) == (0.0, 0.0)
        return len(self.members) == 1 and objective.singleton == "zero"

    def scorable(self) -> tuple[Hashable, ...]:
        """Kept members whose reward enters the group's statistics (all but the unscorable)."""
        return tuple(t for t in self.kept() if t not in self._unscorable)

    def reward_tensor(self) -> torch.Tensor:
        """Rewards of the scorable members, floored ones at f_g (float64; once every verdict is in)."""
        floor = self.floor() if self._floored else 0.0
        return torch.tensor(
            [floor if t in self._floored else self._rewards[t] for t in self.scorable()], dtype=torch.float64
        )

    @property
    def has_sums(self) -> bool:
        return self.has_dense_sums or bool(self._deferred) or bool(self._flagged_sums)

    @property
    def has_dense_sums(self) -> bool:
        return bool(self._by_reward) or self._g1 is not None or self._floor_sum is not None

    def usage(self, buffer_bytes: int) -> GroupUsage:
        """What the group holds now; a flat buffer takes ``buffer_bytes``,
        a deferred gradient its own bytes."""
        held = (*self._held.values(), *self._held_regulariser.values())
        held_bytes = sum(h.nbytes if isinstance(h, DeferredGradient) else buffer_bytes for h in held)
        side = sum(h.nbytes for h in held if isinstance(h, DeferredGradient)) + sum(
            c.nbytes for _, c in self._deferred
        )
        side += self._leaves.nbytes if self._leaves is not None else 0
        return GroupUsage(len(self._held.keys() | self._held_regulariser.keys()), held_bytes, side)

    def add_known(
        self, store: GradientStore, reward: float | None, grads: list | torch.Tensor | DeferredGradient
    ) -> None:
        """A reward-known gradient (per-parameter ``grads``, a stored flat buffer or a deferred
        gradient) into the sums of its reward (``None``: a floored member's, into F); a deferred one
        is kept while they fit (module docstring)."""
        if reward is None:
            self._floor_sum = _add_to(store, self._floor_sum, grads)
            return
        if isinstance(grads, DeferredGradient):
            if not self.has_dense_sums and self._fits(grads, reward, store.buffer_bytes):
                self._deferred.append((reward, grads))
                return
            grads = grads.dense()
        self._spill(store)
        if isinstance(grads, torch.Tensor):
            self.accumulate(store, reward, flat=grads)
        else:
            self.accumulate(store, reward, grads=grads)

    def _fits(self, item: DeferredGradient, reward: float, buffer_bytes: int) -> bool:
        rewards = {r for r, _ in self._deferred} | {reward}
        used = sum(c.nbytes for _, c in self._deferred) + item.nbytes
        return used <= buffer_bytes * min(2, len(rewards))

    def _spill(self, store: GradientStore) -> None:
        """Form the reward-known deferred gradients into the dense sums."""
        kept, self._deferred = self._deferred, []
        for reward, item in kept:
            self.accumulate(store, reward, grads=item.dense())

    def accumulate(
        self,
        store: GradientStore,
        reward: float,
        grads: list | None = None,
        flat: torch.Tensor | None = None,
    ) -> None:
        """Add one dense gradient (per-parameter ``grads`` or a stored ``flat`` buffer) to the sums."""

        def add(buf: torch.Tensor, alpha: float = 1.0) -> None:
            if flat is not None:
                store.add_flat(buf, flat, alpha)
            else:
                store.add_grads(buf, grads, alpha)

        if self._g1 is not None:
            self._fit_scale(store, reward)
            add(self._g1, reward / self._scale - self._shift / self._scale)
            add(self._g2)
            store.release(flat)
            return
        buf = self._by_reward.get(reward)
        if buf is not None:
            add(buf)
            store.release(flat)
            return
        if flat is None:
            flat = store.flatten(grads)
        if len(self._by_reward) < 2:
            self._by_reward[reward] = flat
            return
        c = next(iter(self._by_reward))  # a third distinct reward: collapse (see module docstring)
        z = _power_of_two_above(max(abs(r) for r in (reward, *self._by_reward)))
        g1 = store.scaled(flat, reward / z - c / z)
        g2 = flat
        for r, h in self._by_reward.items():
            store.add_flat(g1, h, r / z - c / z)
            store.add_flat(g2, h)
            store.release(h)
        self._by_reward.clear()
        self._g1, self._g2, self._shift, self._scale = g1, g2, c, z

    def _fit_scale(self, store: GradientStore, reward: float) -> None:
        """Raise z (exact: G1 times a power of two) when ``reward`` is beyond it."""
        z = _power_of_two_above(abs(reward))
        if z > self._scale:
            assert self._g1 is not None
            store.ready(self._g1)
            self._g1.mul_(self._scale / z)
            self._scale = z

    def take(self, destination: Destination, grads: list | DeferredGradient, store: GradientStore) -> None:
        """One backward job's gradient: into the sum of its reward (``sum``; ``flagged``: the
        flagged sum), the group's R sum (``regulariser_sum``), or held (``held``, ``regulariser_held``)."""
        if destination.kind == "sum" and destination.flagged:
            self.add_flagged(store, destination.reward, grads)  # type: ignore[arg-type]
            return
        if destination.kind == "sum":
            self.add_known(store, destination.reward, grads)  # type: ignore[arg-type]
            return
        if destination.kind == "regulariser_sum":
            self.add_regulariser(store, grads)
            return
        kept = grads if isinstance(grads, DeferredGradient) else store.flatten(grads)
        (self._held if destination.kind == "held" else self._held_regulariser)[destination.trajectory] = kept

    def add_flagged(
        self, store: GradientStore, reward: float | None, grads: list | torch.Tensor | DeferredGradient
    ) -> None:
        """A flagged member's reward-known gradient into the flagged sum of its reward (``None``: of
        the floored members; never collapsed: its coefficient max(a r + b, 0) is not affine in r)."""
        self._flagged_sums[reward] = _add_to(store, self._flagged_sums.get(reward), grads)

    def add_regulariser(self, store: GradientStore, grads: list | torch.Tensor | DeferredGradient) -> None:
        """grad R of members (per-parameter, a stored flat buffer or a deferred gradient) into
        :attr:`regulariser_sum`."""
        self._regulariser_sum = _add_to(store, self._regulariser_sum, grads)

    def fold_into(
        self, final: torch.Tensor, store: GradientStore, a: float, b: float, floor: float = 0.0
    ) -> None:
        """``final += sum_i (a r_i + b) grad S_i`` from the sums, floored members at r_i = ``floor``
        (the caller then drops them)."""
        if self._g1 is not None:
            final.add_(store.to_device(self._g1), alpha=a * self._scale)
            final.add_(store.to_device(self._g2), alpha=a * self._shift + b)
        if self._floor_sum is not None:
            final.add_(store.to_device(self._floor_sum), alpha=a * floor + b)
        for r, h in self._by_reward.items():
            final.add_(store.to_device(h), alpha=a * r + b)
        if self._deferred:
            fold_deferred(
                store.split(final), [c for _, c in self._deferred], [a * r + b for r, _ in self._deferred]
            )
        for r, h in self._flagged_sums.items():
            coef = a * (floor if r is None else r) + b
            if coef > 0:  # a flagged member with A < 0 trains nothing
                final.add_(store.to_device(h), alpha=coef)

    def add_reward(
        self,
        trajectory_id: Hashable,
        reward: float,
        dropping: bool,
        store: GradientStore,
        regulariser_apart: bool,
        keep_regulariser: bool,
        *,
        floored: bool = False,
        unscorable: bool = False,
    ) -> torch.Tensor | DeferredGradient | None:
        """A member's verdict: its held gradient joins the sum of its reward (``floored``: F;
        ``unscorable``: freed; or, ``dropping``, the member leaves the group and its held gradients
        are freed). Its held grad R_i joins the group's R sum (``keep_regulariser``: dynamic
        sampling) or is returned for the step's gradient."""
        self._rewards[trajectory_id] = reward
        if floored:
            self._floored.add(trajectory_id)
        if unscorable:
            self._unscorable.add(trajectory_id)
        held = self._held.pop(trajectory_id, None)
        held_reg = self._held_regulariser.pop(trajectory_id, None)
        key = None if floored else reward
        if self._leaves is not None:
            self._leaves.on_reward(trajectory_id, key, dropping, regulariser_apart, keep_score=not unscorable)
        if unscorable and held is not None:
            release(store, held)
            held = None
        if dropping:
            self._dropped.add(trajectory_id)
            if trajectory_id in self._scores:
                self._scored_dropped.add(trajectory_id)
            self._scores.pop(trajectory_id, None)
            self._regulariser.pop(trajectory_id, None)
            release(store, held, held_reg)
            return None
        if held is not None and trajectory_id in self._flagged:
            self.add_flagged(store, key, held)
        elif held is not None:
            self.add_known(store, key, held)
        if held_reg is not None and keep_regulariser:
            self.add_regulariser(store, held_reg)  # the step gets it once the group is known kept
            return None
        if held_reg is not None:
            self._direct += 1
        return held_reg

    def decide(self, objective: Objective, store: GradientStore) -> torch.Tensor | None:
        """Dynamic sampling, every verdict in: filter a group without signal (its R sum is freed), or
        return a kept group's R sum for the step's gradient."""
        self._filtered = not informative(self.reward_tensor().tolist(), objective.singleton == "reward")
        kept, self._regulariser_sum = self._regulariser_sum, None
        if kept is None:
            return None
        if self._filtered:
            release(store, kept)
            return None
        self._direct += 1
        return kept

    def fold(self, objective: Objective, final: Callable[[], torch.Tensor], store: GradientStore) -> None:
        """All verdicts known: a_g, b_g are fixed, so add the sums to ``final()`` (the step's scaled
        gradient) and free them."""
        if self.has_sums and not self._filtered and not self.zero_advantage(objective):
            a, b = self.coefficients(objective)
            self.fold_into(final(), store, a, b, self.floor())
            self._direct += 1
        self.drop(store)

    def record_score(
        self,
        trajectory_id: Hashable,
        score: float,
        tokens: float,
        regulariser: float | None,
        is_weights: tuple[float, float] = (0.0, 0.0),
    ) -> None:
        """A member's S_i (and R_i) value, scored-token count and importance-weight (sum, count); a
        dropped member is only marked scored."""
        if trajectory_id in self._dropped:
            self._scored_dropped.add(trajectory_id)
            return
        self._scores[trajectory_id] = score
        self._tokens[trajectory_id] = tokens
        self._is_weights[trajectory_id] = is_weights
        if regulariser is not None:
            self._regulariser[trajectory_id] = regulariser

    def close(self, group_id: Hashable, a: float, b: float) -> ClosedGroup:
        """The closed group's parts, given its coefficients
        (every verdict known, every kept member scored)."""
        kept = self.kept()
        rewards = self.reward_tensor()
        trained = {t: r for t in kept if (r := self.reward_of(t)) is not None}
        objective = sum(self._masked(a * trained[t] + b, t) * self._scores[t] for t in trained)
        regulariser = sum(self._regulariser.get(t, 0.0) for t in kept)
        totals = BatchTotals(
            groups=float(bool(kept)),
            sequences=float(len(kept)),
            tokens=sum(self._tokens.get(t, 0.0) for t in kept),
            reward_count=float(rewards.numel()),
            reward_sum=float(rewards.sum()),
            reward_sq_sum=float((rewards**2).sum()),
            is_weight_sum=sum(self._is_weights.get(t, (0.0, 0.0))[0] for t in kept),
            is_weight_count=sum(self._is_weights.get(t, (0.0, 0.0))[1] for t in kept),
        )
        mean = float(rewards.mean()) if rewards.numel() else 0.0
        std = float(rewards.std(correction=0)) if rewards.numel() else 0.0
        unscorable = len(self._unscorable - self._dropped)
        stat = GroupStat(group_id, len(kept), mean, std, len(self._dropped), unscorable)
        return ClosedGroup(objective, regulariser, totals, stat)

    def _masked(self, advantage: float, trajectory_id: Hashable) -> float:
        return 0.0 if trajectory_id in self._flagged and advantage < 0 else advantage

    def describe_missing(self, group_id: Hashable) -> str:
        no_reward = [t for t in self.members if t not in self._rewards]
        no_logprob = [t for t in self.kept() if t not in self._scores]
        return f"group {group_id!r} misses rewards of {no_reward} and logprobs of {no_logprob}"

    def drop(self, store: GradientStore) -> None:
        """Free every buffer of the group (held gradients, sums and deferred gradients)."""
        release(
            store,
            *self._held.values(),
            *self._held_regulariser.values(),
            *self._by_reward.values(),
            self._g1,
            self._g2,
            self._floor_sum,
            self._regulariser_sum,
            *self._flagged_sums.values(),
        )
        self._regulariser_sum = None
        self._flagged_sums.clear()
        self._held.clear()
        self._held_regulariser.clear()
        self._by_reward.clear()
        self._deferred.clear()
        self._g1 = self._g2 = self._floor_sum = None


def release(store: GradientStore, *items: torch.Tensor | DeferredGradient | None) -> None:
    """Return the flat buffers among ``items`` to the store (deferred gradients are simply forgotten)."""
    store.release(*(t for t in items if not isinstance(t, DeferredGradient)))


def _add_to(
    store: GradientStore, buf: torch.Tensor | None, grads: list | torch.Tensor | DeferredGradient
) -> torch.Tensor:
    """``buf + grads`` into a flat buffer (``buf`` None: a new one); a stored flat ``grads`` is released."""
    if isinstance(grads, DeferredGradient):
        grads = grads.dense()
    if isinstance(grads, torch.Tensor):
        if buf is None:
            return grads
        store.add_flat(buf, grads)
        store.release(grads)
        return buf
    if buf is None:
        return store.flatten(grads)
    store.add_grads(buf, grads)
    return buf


def _power_of_two_above(m: float) -> float:
    """z = 1 for m <= 2^20, else the smallest power of two >= m (at most 2^1023)."""
    if m <= 2.0**20:
        return 1.0
    return math.ldexp(1.0, min(math.frexp(m)[1], 1023))
