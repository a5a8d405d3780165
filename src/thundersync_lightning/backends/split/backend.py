"""The split backward as a backward backend
(:class:`~thundersync_lightning.core.gradients.backward.BackwardBackend`).

A learner call may span up to :attr:`SplitBackend.destinations` destinations. When it spans more
than one, its scoring runs inside the backend's :class:`~.backward.RowCapture` (the
:class:`~thundersync_lightning.core.gradients.backward.ForwardWatch` that :meth:`SplitBackend.watch` hands
out), and :meth:`SplitBackend.deliver` takes ONE backward for all its destinations, split by row
(:func:`~.backward.split_gradients`); a destination whose coefficient is not known yet may come
back as factors (:class:`~.factors.Chunk`). Any other call takes one backward per destination,
as the plain backend does.

The first split call is checked against the per-destination passes. A model that fails is
refused: with ``strict`` a :class:`~thundersync_lightning.core.errors.ConfigError`, otherwise a
warning, and from then on this backend behaves as the plain one (one destination per call).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from torch import Tensor, nn

from ...core.errors import ConfigError
from ...core.gradients.backward import Delivery, LearnerCall
from .backward import RowCapture, split_gradients

__all__ = ["SplitBackend", "CALL_GRADIENT_BYTES", "max_destinations", "destinations_within"]

log = logging.getLogger(__name__)

#: The most bytes of gradients one split call holds at once (one gradient per destination).
CALL_GRADIENT_BYTES = 2 * 2**30


def max_destinations(params: Sequence[Tensor]) -> int:
    """Destinations one split call may span: its gradients (one per destination) within
    :data:`CALL_GRADIENT_BYTES`, and never fewer than two."""
    return destinations_within(sum(p.numel() * p.element_size() for p in params))


def destinations_within(gradient_bytes: int) -> int:
    return max(2, CALL_GRADIENT_BYTES // max(1, gradient_bytes))


class SplitBackend:
    """One backward for every destination of a learner call (module docstring).

    Args:
        model: the module whose forwards are scored (its trainable parameters must sit in
            modules the split can handle: :func:`~.backward.unsupported_modules`).
        params: the trainable parameters (the accumulator's).
        strict: a model that fails the first-use check raises (else: warn and stop splitting).
        factors: a destination whose coefficient is not known yet keeps its Linear/Embedding
            weight gradients as factors where they are smaller (:mod:`~.factors`); False keeps
            every destination dense (same gradient up to summation order).
    """

    def __init__(
        self, model: nn.Module, params: Sequence[Tensor], *, strict: bool = True, factors: bool = True
    ) -> None:
        if not isinstance(factors, bool):
            raise ConfigError(f"SplitBackend: factors must be True or False, got {factors!r}")
        self.capture = RowCapture(model, params, strict=strict)
        self.factors = factors
        self._params = tuple(params)
        self._max = max_destinations(self._params)
        self._warned = False

    @property
    def refused(self) -> str | None:
        """Why the model was refused at first use (None: it was not)."""
        return self.capture.refused

    @property
    def verified(self) -> bool:
        """The first split call matched the per-destination passes."""
        return self.capture.verified

    @property
    def destinations(self) -> int:
        return 1 if self.refused is not None else self._max

    def watch(self, destinations: int) -> RowCapture | None:
        return self.capture if destinations > 1 and self.refused is None else None

    def deliver(self, call: LearnerCall) -> Delivery:
        if call.watch is None:
            return call.run_jobs()
        if call.watch is not self.capture:
            raise ConfigError("SplitBackend.deliver: the batch was scored under another backend's watch")
        try:
            if len(call.inputs) != len(self._params) or any(
                a is not b for a, b in zip(call.inputs, self._params)
            ):
                raise ConfigError(
                    "the split backward takes the gradients of the trainable parameters alone: it cannot be "
                    "combined with a shared prefix (the boundary cut)"
                )
            factor = [self.factors and d for d in call.deferrable]
            if len(call.jobs) > 1 or any(factor):
                grads, passes = split_gradients(
                    self.capture, call.label, call.jobs, call.terms, call.inputs, call.rows, factor
                )
            else:
                grads, passes = call.run_jobs()
        finally:
            self.capture.clear()
        if self.refused is not None and not self._warned:
            self._warned = True
            log.warning("split_backward='auto' turned off for this fit: %s", self.refused)
        return Delivery(list(grads), passes)
