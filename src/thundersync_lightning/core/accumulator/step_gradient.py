"""The step's gradient: everything whose coefficient is already known, on the parameters' device.

Notation of :mod:`~thundersync_lightning.core.accumulator.streaming`. Two flat buffers in the accumulation
dtype, each allocated on first use:

- ``scaled``: the batch scale s multiplies it at the barrier (advantage-weighted terms, folded
  groups, and the regulariser gradient grad R_i unless ``scale="batch"``);
- ``unscaled``: grad R_i under ``scale="batch"``, which s must not touch.

At the barrier ``g = s * scaled + unscaled`` and ``.grad += -(1/D) g``, cast to each parameter's
dtype; a non-finite g raises :class:`~thundersync_lightning.core.errors.NonFiniteAdvantageError`
before any ``.grad`` is written (one reduction and one device sync per step). The buffers always stay on the
parameters' device (whatever ``offload`` says for sums).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..errors import NonFiniteAdvantageError
from ..gradients.deferred import DeferredGradient, fold_deferred
from ..gradients.storage import GradientStore

__all__ = ["StepGradient"]


class StepGradient:
    """The scaled and unscaled step buffers of one accumulator (see the module docstring)."""

    def __init__(self, store: GradientStore) -> None:
        self._store = store
        self.reset()

    def reset(self) -> None:
        """Forget both buffers (a new step; the store's counters restart with it)."""
        self._scaled: Tensor | None = None
        self._unscaled: Tensor | None = None

    def scaled(self) -> Tensor:
        if self._scaled is None:
            self._scaled = self._store.zeros_on_device()
        return self._scaled

    def unscaled(self) -> Tensor:
        if self._unscaled is None:
            self._unscaled = self._store.zeros_on_device()
        return self._unscaled

    def add_grads(self, buf: Tensor, grads: Sequence[Tensor | None]) -> None:
        """``buf += grads`` (per-parameter gradients, None for no path), in the buffer's dtype."""
        for view, g in zip(self._store.split(buf), grads):
            if g is not None:
                view.add_(g.to(view.dtype))

    def add_flat(self, buf: Tensor, flat: Tensor | DeferredGradient) -> None:
        """``buf += flat`` for a stored flat buffer, which is released (the caller forgets it), or
        for a deferred gradient (formed into the buffer)."""
        if isinstance(flat, DeferredGradient):
            fold_deferred(self._store.split(buf), [flat], [1.0])
            return
        buf.add_(self._store.to_device(flat))
        self._store.release(flat)

    def apply(self, params: Sequence[Tensor], s: float, d: float) -> None:
        """Add ``-(1/D) (s * scaled + unscaled)`` to each ``.grad`` and release both buffers.

        With nothing to add (no buffer, or D = 0) a parameter without ``.grad`` gets zeros, as a
        synchronous ``loss.backward()`` would leave, so optimizers apply momentum/weight decay the
        same way.
        """
        final, rest = self._scaled, self._unscaled
        if final is not None and rest is not None:
            final.mul_(s).add_(rest)
        elif final is None and rest is not None:
            final, rest = rest, None
        elif final is not None:
            final.mul_(s)
        if final is not None and not bool(torch.isfinite(final).all()):
            bad = int((~torch.isfinite(final)).sum())
            for buf in (final, rest):
                if buf is not None:
                    self._store.release_device(buf)
            self.reset()
            raise NonFiniteAdvantageError(
                f"the step's gradient has {bad} non-finite entries (batch scale s={s!r}); no .grad was "
                "written, so no parameter becomes NaN. A reward so large that A_i * grad S_i overflows the "
                "gradient dtype is the usual cause: bound the rewards with Objective.max_abs_reward"
            )
        if final is not None and d > 0:
            for p, g in zip(params, self._store.split(final)):
                contribution = (g * (-1.0 / d)).to(p.dtype)
                if p.grad is None:
                    p.grad = contribution.clone()
                else:
                    p.grad.add_(contribution)
        else:
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        for buf in (final, rest):
            if buf is not None:
                self._store.release_device(buf)
        self.reset()
