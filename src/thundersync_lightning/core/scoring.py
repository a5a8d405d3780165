"""Scoring: a module's token scores and the trajectories become the objective's per-trajectory terms.

The one recipe every path uses (the streaming runner through :meth:`StreamingGRPO.add_scored
<thundersync_lightning.core.accumulator.streaming.StreamingGRPO.add_scored>`, the strategy's
score function, ``GRPOPolicy.grpo_loss``). The module scores what :func:`score_needs` asks for;
then, once and in this order:

1. ``top_entropy_quantile`` < 1: the step's entropy threshold (:func:`step_entropy_threshold`,
   over every scored token of the step) is set on the scores;
2. ``overlong_filter``: each trajectory that hit the length limit is marked truncated;
3. the engines' sampling logprobs e_it are laid out like the scored positions (importance
   correction, rejection, the on-policy statistics; None where an engine shipped none);
4. OPD (``opd_coef`` != 0): the teacher's logprobs p_it, shipped by the engine, likewise;

and :func:`~thundersync_lightning.core.grpo.terms.trajectory_terms` turns them into S_i, R_i and
the counts. A new per-token option touches the objective and this recipe or the terms, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import NamedTuple

from torch import Tensor

from .errors import InvalidLogprobError
from .grpo.objective import Objective
from .grpo.terms import (
    TokenScores,
    TrajectoryTerms,
    engine_logprobs,
    entropy_threshold,
    mark_truncated,
    teacher_logprobs,
    trajectory_terms,
)
from .types import Trajectory

__all__ = ["ScoredInputs", "score_needs", "step_entropy_threshold", "scored_inputs", "objective_terms"]


def score_needs(objective: Objective) -> dict[str, bool]:
    """What the module's ``score_tokens`` must return besides logprobs: ``entropy=``, ``reference=``."""
    return {"entropy": objective.needs_entropy, "reference": objective.needs_reference}


def step_entropy_threshold(objective: Objective, entropies: Sequence[Tensor]) -> float | None:
    """The step's threshold of ``top_entropy_quantile`` over ``entropies`` (scored positions' entropies,
    every rank's for a global one); None when the objective selects no tokens by entropy."""
    if not objective.selects_tokens_by_entropy:
        return None
    return entropy_threshold(objective.top_entropy_quantile, entropies)


class ScoredInputs(NamedTuple):
    """What :func:`~thundersync_lightning.core.grpo.terms.trajectory_terms` (and
    ``StreamingGRPO.add_tokens``) take: the scores with the options set, e_it and p_it."""

    scores: TokenScores
    engine_logprobs: Tensor | None
    teacher_logprobs: Tensor | None


def scored_inputs(
    objective: Objective,
    trajectories: Sequence[Trajectory],
    scores: TokenScores,
    entropy_threshold: float | None = None,
) -> ScoredInputs:
    """Steps 1-4 of the module docstring on ``scores`` (rows: ``trajectories``). ``entropy_threshold``:
    the step's (:func:`step_entropy_threshold`), needed when ``top_entropy_quantile`` < 1."""
    if len(trajectories) != scores.n:
        raise InvalidLogprobError(f"got {scores.n} scored rows for {len(trajectories)} trajectories")
    if objective.selects_tokens_by_entropy:
        scores = replace(scores, entropy_threshold=entropy_threshold)
    if objective.overlong_filter:
        scores = mark_truncated(scores, trajectories)
    engine = engine_logprobs(trajectories, scores.mask, scores.logprobs.dtype)
    teacher = (
        teacher_logprobs(trajectories, scores.mask, scores.logprobs.dtype)
        if objective.needs_teacher
        else None
    )
    return ScoredInputs(scores, engine, teacher)


def objective_terms(
    objective: Objective,
    trajectories: Sequence[Trajectory],
    scores: TokenScores,
    entropy_threshold: float | None = None,
) -> TrajectoryTerms:
    """The per-trajectory terms of ``trajectories`` (rows of ``scores``): :func:`scored_inputs`, then
    :func:`~thundersync_lightning.core.grpo.terms.trajectory_terms`."""
    return trajectory_terms(objective, *scored_inputs(objective, trajectories, scores, entropy_threshold))
