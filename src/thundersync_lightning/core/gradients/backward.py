"""The backward backend: how one learner call's backward runs and each destination gets its gradient.

:meth:`~thundersync_lightning.core.accumulator.streaming.StreamingGRPO.add_tokens` routes a scored batch's
rows to destinations (:mod:`~thundersync_lightning.core.accumulator.routing`) and makes one
:class:`~thundersync_lightning.core.accumulator.jobs.Job` per destination: a scalar whose gradient goes to one
place (the step's gradient, a group's sum for one reward, a held gradient). A backend runs the
call's backward and *delivers* each job's gradient. Every backend delivers the same gradients up
to summation order; they differ only in cost. The accumulator and the strategy's runner talk to
a backend through :class:`BackwardBackend` alone:

- :attr:`~BackwardBackend.destinations`: the most destinations one learner call may span. The
  runner's choice of a call's rows reads it (1: each call feeds one place).
- :meth:`~BackwardBackend.watch`: for a call feeding ``n`` destinations, what the scoring runs
  its forwards inside (:class:`ForwardWatch`; None: nothing). A module's ``score_tokens(...,
  watch=)`` runs inside ``with watch:`` and each micro-batch forward inside
  ``watch.rows(index)``, ``index`` being the batch row of each dim-0 position.
- :meth:`~BackwardBackend.deliver`: the call's backward (:class:`LearnerCall`: its jobs, their
  terms, that watch).

:class:`PlainBackward`, the default, takes one ``autograd.grad`` per job on the shared graph
(:func:`~thundersync_lightning.core.accumulator.jobs.run_jobs`), watches nothing and keeps each call to one
destination. Opt-in backends live in :mod:`thundersync_lightning.backends`; the strategy picks one.

A backend may deliver a job whose coefficient is not known yet (``deferrable``) as a
:class:`~thundersync_lightning.core.gradients.deferred.DeferredGradient`: its own compact form, formed when
the coefficient is known, never taking more bytes than the dense gradient it stands for. The accumulator keeps
it, counts its ``nbytes`` and folds it (:mod:`~thundersync_lightning.core.gradients.deferred`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from contextlib import AbstractContextManager
from typing import NamedTuple, Protocol, runtime_checkable

from torch import Tensor

from ..accumulator.jobs import Grads, Job, run_jobs
from ..grpo.terms import TrajectoryTerms
from .deferred import DeferredGradient

__all__ = ["BackwardBackend", "PlainBackward", "ForwardWatch", "LearnerCall", "Delivery", "Delivered"]


#: One job's delivered gradient: per-parameter tensors (None: no path) or a deferred gradient.
Delivered = Grads | DeferredGradient


class LearnerCall(NamedTuple):
    """One ``add_tokens`` call's backward work, as the accumulator hands it to its backend."""

    label: Hashable  # names the call in errors
    jobs: Sequence[Job]  # one per destination (:mod:`~thundersync_lightning.core.accumulator.jobs`)
    terms: TrajectoryTerms  # the rows' S_i and R_i, whose graphs the jobs' scalars share
    inputs: Sequence[Tensor]  # what to differentiate with respect to (the parameters, prefix leaves)
    rows: Sequence[int]  # the scored batch's row of each row of ``terms``
    deferrable: Sequence[bool]  # per job: may come back as a DeferredGradient
    watch: ForwardWatch | None  # what :meth:`BackwardBackend.watch` gave the call's scoring

    def run_jobs(self) -> Delivery:
        """One ``autograd.grad`` per job: the plain way, which any backend may fall back to."""
        return Delivery(list(run_jobs(self.label, self.jobs, self.inputs)), len(self.jobs))


class Delivery(NamedTuple):
    """What a backend's :meth:`~BackwardBackend.deliver` returns."""

    grads: list[Delivered]  # one per job, in the jobs' order
    passes: int  # backward passes taken


@runtime_checkable
class ForwardWatch(Protocol):
    """What a call's scoring runs inside: ``with watch:`` around it, ``watch.rows(index)`` around
    each forward (``index``: the batch row of each dim-0 position of that forward)."""

    def __enter__(self) -> ForwardWatch: ...

    def __exit__(self, *exc: object) -> None: ...

    def rows(self, index: Sequence[int]) -> AbstractContextManager[None]: ...


class BackwardBackend(Protocol):
    """Runs a learner call's backward and delivers each destination's gradient (module docstring)."""

    @property
    def destinations(self) -> int:
        """The most destinations one learner call may span (>= 1)."""
        ...

    def watch(self, destinations: int) -> ForwardWatch | None:
        """What a call feeding ``destinations`` places scores its forwards inside (None: nothing)."""
        ...

    def deliver(self, call: LearnerCall) -> Delivery:
        """Each job's gradient with respect to ``call.inputs`` and the backward passes taken;
        raises before the accumulator changes any state."""
        ...


class PlainBackward:
    """The default backend: one ``autograd.grad`` per destination, each call feeding one."""

    destinations = 1

    def watch(self, destinations: int) -> None:
        return None

    def deliver(self, call: LearnerCall) -> Delivery:
        return call.run_jobs()
