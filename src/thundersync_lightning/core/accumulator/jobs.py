"""The backward passes of the streaming accumulator: one job per destination of a gradient.

A scored batch is routed by :func:`~thundersync_lightning.core.accumulator.routing.route`; every
destination (:class:`~thundersync_lightning.core.accumulator.destination.Destination`) becomes one
:class:`Job`, a scalar whose gradient goes to that one place.

:func:`run_jobs` takes one ``autograd.grad`` per job on the shared graph (retained until the
last), so a failing job raises before the accumulator changes any state.
:func:`prefix_backward` is the boundary cut's single backward of a closed group's prompt.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from ..errors import InvalidLogprobError
from ..grpo.terms import TrajectoryTerms
from .boundary_cut import LeafSums
from .destination import STEP, STEP_REGULARISER, Destination, DestinationKind
from .routing import Routing

__all__ = ["Job", "JobKind", "jobs_of", "run_jobs", "grad_of", "prefix_backward", "select_terms"]

JobKind = DestinationKind
Grads = list[Tensor | None]


class Job(NamedTuple):
    destination: Destination
    term: Tensor  # the scalar whose gradient this job takes

    @property
    def kind(self) -> JobKind:
        return self.destination.kind


def jobs_of(routing: Routing, rows: Sequence[Hashable], terms: TrajectoryTerms) -> list[Job]:
    """One job per destination of the routing; everything that ends in one place shares a backward."""
    jobs: list[Job] = []
    if routing.direct:
        jobs.append(Job(STEP, torch.stack(routing.direct).sum()))
    if routing.direct_regulariser:
        jobs.append(Job(STEP_REGULARISER, torch.stack(routing.direct_regulariser).sum()))
    jobs += [Job(dest, terms.score[r].sum()) for dest, r in routing.buckets.items()]
    regulariser = terms.regulariser
    jobs += [
        Job(Destination.group_regulariser(g), regulariser[r].sum())
        for g, r in routing.group_regulariser.items()
    ]  # type: ignore[index]
    jobs += [Job(Destination.held(rows[i]), terms.score[i]) for i in routing.held]
    jobs += [
        Job(Destination.held(rows[i], regulariser=True), regulariser[i]) for i in routing.held_regulariser
    ]  # type: ignore[index]
    return jobs


def run_jobs(
    label: Hashable, jobs: Sequence[Job], inputs: Sequence[Tensor], *, retain: bool = False
) -> list[Grads]:
    """Each job's gradient with respect to ``inputs`` (the graph is freed after the last one
    unless ``retain``)."""
    return [
        grad_of(label, job.term, inputs, retain=retain or k < len(jobs) - 1) for k, job in enumerate(jobs)
    ]


def grad_of(label: Hashable, output: Tensor, inputs: Sequence[Tensor], retain: bool = False) -> Grads:
    """``autograd.grad(output, inputs)``; errors name the trajectory (``label``) and the cause."""
    try:
        grads = torch.autograd.grad(output, list(inputs), allow_unused=True, retain_graph=retain)
    except RuntimeError as err:
        raise InvalidLogprobError(
            f"backward of trajectory {label!r}'s logprob failed ({err}); it must be a scalar "
            "computed from the parameters in this step's graph"
        ) from err
    if all(g is None for g in grads):
        raise InvalidLogprobError(
            f"trajectory {label!r}'s logprob has no autograd path to the parameters; "
            "compute it from the policy's forward pass"
        )
    return list(grads)


def prefix_backward(
    leaves: LeafSums, params: Sequence[Tensor], a: float, b: float, floor: float = 0.0
) -> Iterator[tuple[Literal["direct", "regulariser_now"], Grads]]:
    """The closed group's prompt, backpropagated with its folded leaf gradient (:mod:`.prefix`).

    Yields (destination, parameter gradients) per backward pass: at most one into the scaled step
    gradient and one into the R-term one (two only under ``scale="batch"`` with R terms); the
    caller adds each before the next is taken. The leaf sums are dropped.
    """
    scaled, unscaled = leaves.fold(a, b, floor)
    targets = [("direct", scaled), ("regulariser_now", unscaled)]
    targets = [(kind, g) for kind, g in targets if g is not None and bool(g.ne(0).any())]
    for k, (kind, flat) in enumerate(targets):
        grads = torch.autograd.grad(
            list(leaves.prefix.outputs),
            list(params),
            grad_outputs=leaves.prefix.split(flat),  # type: ignore[arg-type]
            allow_unused=True,
            retain_graph=k < len(targets) - 1,
        )
        yield kind, list(grads)  # type: ignore[misc]


def select_terms(terms: TrajectoryTerms, rows: list[int]) -> TrajectoryTerms:
    """The terms of a subset of a scored batch (the on-policy statistics stay whole)."""
    index = torch.tensor(rows, dtype=torch.long, device=terms.score.device)
    regulariser = terms.regulariser[index] if terms.regulariser is not None else None
    weights = terms.is_weights[index.to(terms.is_weights.device)] if terms.is_weights is not None else None
    flagged = terms.flagged[index.cpu()] if terms.flagged is not None else None
    return TrajectoryTerms(
        terms.score[index],
        regulariser,
        terms.tokens[index.to(terms.tokens.device)],
        terms.on_policy,
        weights,
        flagged,
    )
