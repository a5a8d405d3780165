"""The boundary cut: a group's shared prompt is run forward and backpropagated once, not G times.

Notation: the G members of group g share the prompt x (tokens 0..P-1). The policy runs x forward
once; its outputs h (per-layer keys/values and the last position's logits) have a graph to theta.
Each continuation reads detached copies h~ of them (leaves that require grad), so the backward of
a trajectory's terms gives grad_theta through the continuation and d/dh~ at the leaves. Since L
depends on h only through the continuations and the fold is linear,

    grad_theta L = (continuation part) + J_h(theta)^T [ s sum_r (a_g r + b_g) H_r + D + D_R ]

with H_r = sum over members with reward r of dS_i/dh~ (the two-sum rule at the leaves; held apart
per trajectory while its reward is pending), D the leaf gradient of terms with a known advantage
and D_R of the regulariser terms R_i. At the group's close one backward of the prompt's
outputs with that leaf gradient (two under ``scale="batch"`` with R terms, where s must not touch
D_R) adds the prompt's contribution exactly once. Leaf sums are prompt-activation sized, not
parameter sized; they and the retained prompt graph are the cost of the cut.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..errors import GroupError
from .destination import Destination

__all__ = ["SharedPrefix", "LeafSums"]


@dataclass(eq=False)
class SharedPrefix:
    """A prompt run forward once: ``outputs`` (a graph to the parameters) and ``leaves`` (detached
    copies requiring grad, same shapes) that the continuations of the group read instead."""

    tokens: tuple[int, ...]
    outputs: tuple[Tensor, ...]
    leaves: tuple[Tensor, ...]
    handle: object = None  # what the policy needs to rebuild its cache from the leaves

    def __post_init__(self) -> None:
        problems = []
        if len(self.outputs) != len(self.leaves) or not self.leaves:
            problems.append(f"{len(self.outputs)} outputs for {len(self.leaves)} leaves")
        for k, (o, leaf) in enumerate(zip(self.outputs, self.leaves)):
            if o.shape != leaf.shape:
                problems.append(f"output {k} has shape {tuple(o.shape)}, its leaf {tuple(leaf.shape)}")
            if not (leaf.is_leaf and leaf.requires_grad):
                problems.append(f"leaf {k} must be a detached tensor that requires grad")
        if problems:
            raise GroupError("invalid SharedPrefix: " + "; ".join(problems))

    @property
    def numel(self) -> int:
        return sum(t.numel() for t in self.leaves)

    def flatten(self, grads: Sequence[Tensor | None]) -> Tensor:
        """Leaf gradients (None -> zeros) as one float64-free flat vector in the leaves' dtype."""
        parts = [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(grads, self.leaves)]
        return torch.cat([p.reshape(-1) for p in parts])

    def split(self, flat: Tensor) -> list[Tensor]:
        return [v.view_as(leaf) for v, leaf in zip(flat.split([t.numel() for t in self.leaves]), self.leaves)]


@dataclass
class LeafSums:
    """One group's sums at the prefix leaves (see the module docstring)."""

    prefix: SharedPrefix
    by_reward: dict[float | None, Tensor] = field(default_factory=dict)  # None: floored members (their f_g)
    direct: Tensor | None = None  # s-scaled at the barrier (advantage-weighted, and R without batch scale)
    direct_regulariser: Tensor | None = None  # never s-scaled (R under batch scale)
    held: dict[Hashable, Tensor] = field(default_factory=dict)
    held_regulariser: dict[Hashable, Tensor] = field(default_factory=dict)

    def add(self, destination: Destination, flat: Tensor, regulariser_apart: bool) -> None:
        """Route one backward pass's leaf gradient like its parameter gradient (the job's ``destination``)."""
        kind = destination.kind
        if kind == "direct":
            self.direct = flat if self.direct is None else self.direct + flat
        elif kind in (
            "regulariser_now",
            "regulariser_sum",
        ):  # the leaves fold at the group's close: kept or filtered then
            self._add_regulariser(flat, regulariser_apart)
        elif kind == "sum":
            reward = destination.reward
            self.by_reward[reward] = flat if reward not in self.by_reward else self.by_reward[reward] + flat
        elif kind == "held":
            self.held[destination.trajectory] = flat
        else:
            self.held_regulariser[destination.trajectory] = flat

    def _add_regulariser(self, flat: Tensor, apart: bool) -> None:
        if apart:
            self.direct_regulariser = (
                flat if self.direct_regulariser is None else self.direct_regulariser + flat
            )
        else:
            self.direct = flat if self.direct is None else self.direct + flat

    def on_reward(
        self,
        trajectory_id: Hashable,
        reward: float | None,
        dropped: bool,
        regulariser_apart: bool,
        keep_score: bool = True,
    ) -> None:
        """A verdict: the held leaf gradients join the sum of ``reward`` (None: the floored members')
        and the R sums; ``keep_score`` False (an unscorable member, advantage 0) frees the S part."""
        held = self.held.pop(trajectory_id, None)
        held_reg = self.held_regulariser.pop(trajectory_id, None)
        if dropped:
            return
        if held is not None and keep_score:
            self.by_reward[reward] = held if reward not in self.by_reward else self.by_reward[reward] + held
        if held_reg is not None:
            self._add_regulariser(held_reg, regulariser_apart)

    def fold(self, a: float, b: float, floor: float = 0.0) -> tuple[Tensor | None, Tensor | None]:
        """(s-scaled, unscaled) leaf gradients of the closed group (floored members at ``floor``);
        the sums are dropped."""
        total = self.direct
        for r, h in self.by_reward.items():
            coef = a * (floor if r is None else r) + b
            if coef != 0.0:
                total = h * coef if total is None else total + h * coef
        out = (total, self.direct_regulariser)
        self.by_reward.clear()
        self.held.clear()
        self.held_regulariser.clear()
        self.direct = self.direct_regulariser = None
        return out

    @property
    def nbytes(self) -> int:
        tensors = [*self.by_reward.values(), *self.held.values(), *self.held_regulariser.values()]
        tensors += [t for t in (self.direct, self.direct_regulariser) if t is not None]
        return sum(t.numel() * t.element_size() for t in tensors)
