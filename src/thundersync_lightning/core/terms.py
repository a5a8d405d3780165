"""Per-trajectory terms of the objective from per-token learner quantities (pure torch).

A policy scores n trajectories in one forward and returns :class:`TokenScores`: right-padded
(n, L) tensors of the learner's log-probabilities l_it of each position's next token, a mask of
the scored positions, and, when the objective needs them, entropies H_it (with a graph) and
reference log-probabilities q_it (no graph). With the engine's sampling log-probabilities e_it
and, for on-policy distillation, the teacher's p_it (both shipped with the trajectory; laid out
like the mask by :func:`engine_logprobs` / :func:`teacher_logprobs`), :func:`trajectory_terms`
turns them into

    S_i = k_i sum_t w_it l_it,
    R_i = k_i sum_t (entropy_coef H_it - kl_coef KL_k(l_it, q_it) - opd_coef [l_it - p_it] l_it)

(notation of :mod:`~thundersync_lightning.core.objective`; [x] is x detached) plus the scored-token counts and the
on-policy diagnostics: |e_it - l_it| (mean and max) and the k3 estimate of KL(engine || learner),
r = exp(l - e), k3 = r - 1 - log r, averaged over scored tokens. Everything but S_i and R_i is
detached. :func:`reference_loss` is the barrier form of the same objective for a complete batch.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .errors import InvalidLogprobError
from .objective import BatchTotals, Objective
from .types import Trajectory

__all__ = [
    "TokenScores",
    "TrajectoryTerms",
    "OnPolicyStats",
    "engine_logprobs",
    "teacher_logprobs",
    "trajectory_terms",
    "reference_loss",
]


@dataclass(frozen=True)
class TokenScores:
    """Learner quantities of n trajectories at positions 0..L-1 (position t predicts token t+1).

    Shapes: ``logprobs`` (n, L) with a graph to the trainable parameters; ``mask`` (n, L) bool,
    True at scored positions, whose count and order equal the trajectory's scored tokens;
    ``entropy`` (n, L) with a graph, or None; ``ref_logprobs`` (n, L) detached, or None.
    """

    logprobs: Tensor
    mask: Tensor
    entropy: Tensor | None = None
    ref_logprobs: Tensor | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.logprobs.shape)
        if self.logprobs.dim() != 2 or tuple(self.mask.shape) != shape:
            raise InvalidLogprobError(
                f"TokenScores needs (n, L) logprobs and a mask of the same shape, got {shape} and "
                f"{tuple(self.mask.shape)}"
            )
        for name in ("entropy", "ref_logprobs"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != shape:
                raise InvalidLogprobError(f"TokenScores.{name} has shape {tuple(t.shape)}, logprobs {shape}")

    @property
    def n(self) -> int:
        return int(self.logprobs.shape[0])


@dataclass(frozen=True, slots=True)
class OnPolicyStats:
    """Engine-vs-learner agreement over scored tokens: sums for exact reduction over ranks."""

    tokens: int = 0
    abs_diff_sum: float = 0.0
    abs_diff_max: float = 0.0
    kl_sum: float = 0.0  # sum of k3 estimates of KL(engine || learner)

    def __add__(self, other: OnPolicyStats) -> OnPolicyStats:
        return OnPolicyStats(
            self.tokens + other.tokens,
            self.abs_diff_sum + other.abs_diff_sum,
            max(self.abs_diff_max, other.abs_diff_max),
            self.kl_sum + other.kl_sum,
        )

    @property
    def abs_diff_mean(self) -> float:
        return self.abs_diff_sum / self.tokens if self.tokens else 0.0

    @property
    def kl(self) -> float:
        return self.kl_sum / self.tokens if self.tokens else 0.0


@dataclass(frozen=True)
class TrajectoryTerms:
    """S (n,) and R (n,) or None with graphs; tokens (n,) scored counts; on-policy stats."""

    score: Tensor
    regulariser: Tensor | None
    tokens: Tensor
    on_policy: OnPolicyStats


def engine_logprobs(trajectories: Sequence[Trajectory], mask: Tensor, dtype: torch.dtype) -> Tensor | None:
    """The engines' sampling logprobs laid out like ``mask`` ((n, L)); None if any trajectory has none."""
    rows = [t.sampling_logprobs for t in trajectories]
    if any(len(r) == 0 for r in rows) and any(t.num_scored_tokens for t in trajectories):
        return None
    return _layout(trajectories, rows, mask, dtype, "engine logprobs")


def teacher_logprobs(trajectories: Sequence[Trajectory], mask: Tensor, dtype: torch.dtype) -> Tensor:
    """The teacher's logprobs p_it of every scored token laid out like ``mask`` ((n, L)).

    Raises :class:`InvalidLogprobError` naming the first trajectory that has none (its engine
    scored no teacher) or whose count does not match its scored positions.
    """
    rows = []
    for t in trajectories:
        r = t.teacher_logprobs
        if r is None:
            raise InvalidLogprobError(
                f"trajectory {t.trajectory_id!r} has no teacher logprobs, and objective.opd_coef > 0 needs "
                "one per scored token: give the engine a teacher (EmbeddedEngineConfig or VLLMEngineConfig: teacher=TeacherConfig(...)) "
                "or set opd_coef=0"
            )
        rows.append(r)
    return _layout(trajectories, rows, mask, dtype, "teacher logprobs")


def _layout(
    trajectories: Sequence[Trajectory], rows: list[tuple[float, ...]], mask: Tensor, dtype: torch.dtype, what: str
) -> Tensor:
    counts = mask.sum(-1).tolist()
    for t, r, c in zip(trajectories, rows, counts):
        if len(r) != c:
            raise InvalidLogprobError(
                f"trajectory {t.trajectory_id!r} has {len(r)} {what} for {c} scored positions; "
                "an engine must report one per sampled token"
            )
    out = torch.zeros(mask.shape, dtype=dtype)
    flat = [v for r in rows for v in r]
    if flat:
        out[mask.cpu()] = torch.tensor(flat, dtype=dtype)
    return out.to(mask.device)


def _kl(objective: Objective, lp: Tensor, ref: Tensor) -> Tensor:
    """Per-token KL(learner || reference) estimate; its gradient flows through ``lp``."""
    if objective.kl_estimator == "k1":
        return lp - ref
    if objective.kl_estimator == "k2":
        return 0.5 * (lp - ref) ** 2
    d = ref - lp
    return torch.exp(d) - d - 1.0


def _is_weights(objective: Objective, log_ratio: Tensor, m: Tensor) -> Tensor:
    """Detached weights from log(learner/engine) per token, TRL's four modes."""
    cap = objective.is_cap
    if objective.is_correction.startswith("sequence"):
        ratio = torch.exp((log_ratio * m).sum(-1, keepdim=True)).expand_as(log_ratio)
    else:
        ratio = torch.exp(log_ratio)
    if objective.is_correction.endswith("truncate"):
        return ratio.clamp(max=cap)
    return torch.where(ratio > cap, torch.zeros_like(ratio), ratio)


def trajectory_terms(
    objective: Objective, scores: TokenScores, engine: Tensor | None, teacher: Tensor | None = None
) -> TrajectoryTerms:
    """S_i, R_i, token counts and on-policy statistics of one scored batch (see module docstring).

    ``engine`` and ``teacher``: (n, L) sampling and teacher log-probabilities laid out like
    ``scores.mask`` (values at unscored positions are ignored); ``teacher`` is required when
    ``objective.opd_coef`` is not 0.
    """
    lp = scores.logprobs
    m = scores.mask.to(lp.dtype)
    tokens = m.sum(-1)  # (n,)
    k = objective.sequence_factor(tokens.detach())
    stats = OnPolicyStats()
    log_ratio = None
    if engine is not None:
        e = engine.to(device=lp.device, dtype=lp.dtype)
        log_ratio = (lp.detach() - e) * m  # (n, L)
        count = int(m.sum())
        if count:
            ratio = torch.exp(log_ratio)
            k3 = (ratio - 1.0 - log_ratio) * m
            stats = OnPolicyStats(
                count, float(log_ratio.abs().sum()), float(log_ratio.abs().max()), float(k3.sum())
            )
    if objective.needs_engine_logprobs:
        if log_ratio is None:
            raise InvalidLogprobError(
                f"is_correction={objective.is_correction!r} needs the engine's sampling logprobs, and this "
                "batch has trajectories without them; use an engine that reports them or is_correction='none'"
            )
        weighted = _is_weights(objective, log_ratio, m).detach() * lp
    else:
        weighted = lp
    score = k * (weighted * m).sum(-1)
    regulariser = None
    if objective.has_regulariser_terms:
        per_token = torch.zeros_like(lp)
        if objective.needs_entropy:
            if scores.entropy is None:
                raise InvalidLogprobError("entropy_coef != 0 but the policy returned no per-token entropy")
            per_token = per_token + objective.entropy_coef * scores.entropy
        if objective.needs_reference:
            if scores.ref_logprobs is None:
                raise InvalidLogprobError("kl_coef != 0 but the policy returned no reference logprobs")
            per_token = per_token - objective.kl_coef * _kl(objective, lp, scores.ref_logprobs.to(lp.dtype))
        if objective.needs_teacher:
            if teacher is None:
                raise InvalidLogprobError(
                    f"opd_coef={objective.opd_coef} needs the teacher's logprobs of every scored token, and this "
                    "batch has none; give the engine a teacher (EmbeddedEngineConfig or VLLMEngineConfig: teacher=TeacherConfig(...))"
                )
            p = teacher.to(device=lp.device, dtype=lp.dtype)
            advantage = -(lp.detach() - p) * m  # (n, L): per-token OPD advantage, masked (p is 0 off the mask)
            per_token = per_token + objective.opd_coef * advantage * lp
        regulariser = k * (per_token * m).sum(-1)
    return TrajectoryTerms(score, regulariser, tokens.detach(), stats)


def reference_loss(
    objective: Objective,
    terms: TrajectoryTerms,
    group_ids: Sequence[Hashable],
    rewards: Sequence[float],
    failed: Sequence[bool] | None = None,
    totals: BatchTotals | None = None,
) -> Tensor:
    """L of a complete batch in one expression (one backward): the synchronous form.

    ``totals`` are the global counts (data parallel); by default this batch's own.
    """
    n = len(group_ids)
    failed = list(failed) if failed is not None else [False] * n
    keep = [not (f and objective.failed == "drop") for f in failed]
    by_group: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        if keep[i]:
            by_group.setdefault(g, []).append(i)
    local = BatchTotals(
        groups=float(len(by_group)),
        sequences=float(sum(keep)),
        tokens=float(sum(float(terms.tokens[i]) for i in range(n) if keep[i])),
        reward_count=float(sum(keep)),
        reward_sum=sum(float(rewards[i]) for i in range(n) if keep[i]),
        reward_sq_sum=sum(float(rewards[i]) ** 2 for i in range(n) if keep[i]),
    )
    totals = totals if totals is not None else local
    s = objective.batch_scale(totals)
    adv = torch.zeros(n, dtype=torch.float64)
    for members in by_group.values():
        adv[members] = objective.advantages(torch.tensor([float(rewards[i]) for i in members]), s)
    weight = torch.tensor(keep, dtype=torch.float64)
    score = terms.score
    total = (adv.to(score.device, score.dtype) * score).sum()
    if terms.regulariser is not None:
        total = total + (weight.to(score.device, score.dtype) * terms.regulariser).sum()
    d = objective.denominator(totals)
    return -total / d if d > 0 and math.isfinite(d) else total * 0.0
