"""A destination's gradient kept in a backward backend's own form until its coefficient is known.

A group's sums and held gradients normally are parameter-sized flat buffers. A backend
(:mod:`~thundersync_lightning.core.gradients.backward`) may instead deliver a job whose coefficient is not
known yet as a :class:`DeferredGradient`, e.g. factors that form the gradient in one matmul: the
accumulator keeps it (counting :attr:`~DeferredGradient.nbytes`), forms it with
:meth:`~DeferredGradient.dense` when it must, and at a group's fold adds every kept one with
its coefficient through :func:`fold_deferred`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from torch import Tensor

__all__ = ["DeferredGradient", "fold_deferred"]


class DeferredGradient(ABC):
    """A destination's gradient held in a backend's own form until its coefficient is known."""

    __slots__ = ()

    @property
    @abstractmethod
    def nbytes(self) -> int:
        """Bytes it holds (never more than the dense gradient's)."""

    @abstractmethod
    def dense(self) -> list[Tensor | None]:
        """Every parameter's gradient formed (float32 or wider; the accumulator casts)."""

    @staticmethod
    @abstractmethod
    def fold(views: Sequence[Tensor], items: Sequence[DeferredGradient], coefs: Sequence[float]) -> None:
        """``views[k] += sum_c coefs[c] * grad_k(items[c])`` for items of this class, in the views' dtype."""


def fold_deferred(views: Sequence[Tensor], items: Sequence[DeferredGradient], coefs: Sequence[float]) -> None:
    """``views[k] += sum_c coefs[c] * grad_k(items[c])``: the items of each class folded together."""
    by_class: dict[type, tuple[list[DeferredGradient], list[float]]] = {}
    for item, coef in zip(items, coefs):
        found, weights = by_class.setdefault(type(item), ([], []))
        found.append(item)
        weights.append(coef)
    for cls, (found, weights) in by_class.items():
        cls.fold(views, found, weights)
