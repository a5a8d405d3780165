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

(notation of :mod:`~thundersync_lightning.core.grpo.objective`; [x] is x detached) plus the scored-token
counts and the on-policy diagnostics: |e_it - l_it| (mean and max) and the k3 estimate of KL(engine ||
learner), r = exp(l - e), k3 = r - 1 - log r, averaged over scored tokens. Everything but S_i and R_i is
detached. :func:`reference_loss` is the barrier form of the same objective for a complete batch.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from ..errors import InvalidLogprobError
from ..types import Trajectory
from .objective import BatchTotals, Objective
from .rejection import rejection_keep

__all__ = [
    "TokenScores",
    "TrajectoryTerms",
    "OnPolicyStats",
    "engine_logprobs",
    "teacher_logprobs",
    "mark_truncated",
    "entropy_threshold",
    "trajectory_terms",
    "reference_loss",
]


@dataclass(frozen=True)
class TokenScores:
    """Learner quantities of n trajectories at positions 0..L-1 (position t predicts token t+1).

    Shapes: ``logprobs`` (n, L) with a graph to the trainable parameters; ``mask`` (n, L) bool,
    True at scored positions, whose count and order equal the trajectory's scored tokens;
    ``entropy`` (n, L) with a graph, or None; ``ref_logprobs`` (n, L) detached, or None;
    ``truncated`` (n,) bool, the trajectory hit the length limit (see :func:`mark_truncated`), or
    None (needed by ``Objective.overlong_filter``); ``entropy_threshold``: the step's entropy
    quantile (see :func:`entropy_threshold`), needed by ``Objective.top_entropy_quantile`` < 1.
    """

    logprobs: Tensor
    mask: Tensor
    entropy: Tensor | None = None
    ref_logprobs: Tensor | None = None
    truncated: Tensor | None = None
    entropy_threshold: float | None = None

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
        if self.truncated is not None and tuple(self.truncated.shape) != shape[:1]:
            raise InvalidLogprobError(
                f"TokenScores.truncated has shape {tuple(self.truncated.shape)}, want ({shape[0]},)"
            )

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
    """S (n,) and R (n,) or None with graphs; tokens (n,) scored counts; on-policy stats;
    ``is_weights`` (n, 2): each trajectory's importance-weight sum and count (``is_batch_normalize``);
    ``flagged`` (n,) bool: off-policy trajectories whose reward term counts only where A >= 0
    (``off_policy_mask``)."""

    score: Tensor
    regulariser: Tensor | None
    tokens: Tensor
    on_policy: OnPolicyStats
    is_weights: Tensor | None = None
    flagged: Tensor | None = None


def engine_logprobs(trajectories: Sequence[Trajectory], mask: Tensor, dtype: torch.dtype) -> Tensor | None:
    """The engines' sampling logprobs laid out like ``mask`` ((n, L)); None if a trajectory with scored
    tokens has none.

    An empty completion (no scored token) has no logprobs and needs none: it is valid input in every
    objective, next to trajectories that have them.
    """
    rows = [t.sampling_logprobs for t in trajectories]
    if any(len(r) == 0 and t.num_scored_tokens for r, t in zip(rows, trajectories)):
        return None
    return _layout(trajectories, rows, mask, dtype, "engine logprobs")


def mark_truncated(scores: TokenScores, trajectories: Sequence[Trajectory]) -> TokenScores:
    """``scores`` with ``truncated`` set from each trajectory's :attr:`~..types.Trajectory.truncated` (its
    context hit the length limit, or an action its token budget without ending the turn)."""
    flags = torch.tensor([t.truncated for t in trajectories], dtype=torch.bool)
    return replace(scores, truncated=flags.to(scores.mask.device))


def entropy_threshold(quantile: float, entropies: Sequence[Tensor]) -> float:
    """The (1 - quantile)-quantile of the scored tokens' entropies (``entropies``: 1-D tensors of
    scored positions, e.g. ``scores.entropy[scores.mask]`` per call; every rank's for a global one).
    With no scored token: +inf (no token is selected)."""
    flat = (
        torch.cat([e.detach().reshape(-1).double().cpu() for e in entropies]) if entropies else torch.zeros(0)
    )
    if flat.numel() == 0:
        return math.inf
    return float(torch.quantile(flat, 1.0 - quantile))


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
                "one per scored token: give the engine a teacher (EmbeddedEngineConfig or VLLMEngineConfig: "
                "teacher=TeacherConfig(...)) or set opd_coef=0"
            )
        rows.append(r)
    return _layout(trajectories, rows, mask, dtype, "teacher logprobs")


def _layout(
    trajectories: Sequence[Trajectory],
    rows: list[tuple[float, ...]],
    mask: Tensor,
    dtype: torch.dtype,
    what: str,
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
    """Per-token KL(learner || reference) estimate; its gradient flows through ``lp``.

    ``k3_corrected`` is k3 times the ratio exp(l - [l]) (value 1): the value of k3 with the gradient
    (l - q) grad l, which is k2's (TRL's ``use_bias_correction_kl=True`` at one update per batch).
    """
    if objective.kl_estimator == "k1":
        return lp - ref
    if objective.kl_estimator == "k2":
        return 0.5 * (lp - ref) ** 2
    d = ref - lp
    k3 = torch.exp(d) - d - 1.0
    if objective.kl_estimator == "k3_corrected":
        return k3 * torch.exp(lp - lp.detach())
    return k3


def _is_weights(objective: Objective, log_ratio: Tensor, m: Tensor) -> Tensor:
    """Detached weights from log(learner/engine) per token, TRL's four modes.

    ``truncate`` clamps the ratio to [is_min, is_cap]; ``mask`` zeroes a ratio outside it (no lower
    bound when ``is_min`` is None).
    """
    cap, low = objective.is_cap, objective.is_min
    if objective.is_correction.startswith("sequence"):
        ratio = torch.exp((log_ratio * m).sum(-1, keepdim=True)).expand_as(log_ratio)
    else:
        ratio = torch.exp(log_ratio)
    if objective.is_correction.endswith("truncate"):
        return ratio.clamp(min=low, max=cap)
    outside = ratio > cap if low is None else (ratio > cap) | (ratio < low)
    return torch.where(outside, torch.zeros_like(ratio), ratio)


def _weight_sums(objective: Objective, w: Tensor, m: Tensor) -> Tensor:
    """(n, 2): sum and count of each trajectory's weights, per token or one per non-empty sequence."""
    count = m.sum(-1)
    if objective.is_correction.startswith("sequence"):
        seq = (count > 0).to(w.dtype)
        return torch.stack([w[:, 0] * seq if w.shape[1] else seq * 0, seq], -1)
    return torch.stack([(w * m).sum(-1), count], -1)


def _entropy_selected(objective: Objective, scores: TokenScores, m: Tensor) -> Tensor:
    """``m`` less the tokens below the step's entropy threshold (``top_entropy_quantile`` < 1)."""
    if not objective.selects_tokens_by_entropy:
        return m
    if scores.entropy is None or scores.entropy_threshold is None:
        raise InvalidLogprobError(
            "top_entropy_quantile < 1 needs per-token entropies and the step's entropy threshold "
            "(TokenScores.entropy_threshold, core.grpo.terms.entropy_threshold over "
            "every scored token of the step)"
        )
    return m * (scores.entropy.detach() >= scores.entropy_threshold).to(m.dtype)


def _trained_mask(objective: Objective, scores: TokenScores, m: Tensor, log_ratio: Tensor | None) -> Tensor:
    """The scored mask less rejected tokens (``rs``) and truncated trajectories (``overlong_filter``)."""
    if objective.rs is not None:
        assert log_ratio is not None
        m = rejection_keep(objective.rejection, log_ratio.detach(), m)
    if objective.overlong_filter:
        if scores.truncated is None:
            raise InvalidLogprobError(
                "overlong_filter needs to know which trajectories hit the length limit: build the "
                "TokenScores with truncated=... (core.grpo.terms.mark_truncated(scores, trajectories))"
            )
        m = m * (~scores.truncated.to(device=m.device, dtype=torch.bool)).to(m.dtype)[:, None]
    return m


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
    if objective.needs_engine_logprobs and log_ratio is None:
        raise InvalidLogprobError(
            f"is_correction={objective.is_correction!r} / rs={objective.rs!r} need the engine's sampling "
            "logprobs, and this batch has trajectories without them; use an engine "
            "that reports them or turn both off"
        )
    weighted = lp
    is_weights = None
    if objective.is_correction != "none":
        assert log_ratio is not None
        w = _is_weights(objective, log_ratio, m).detach()  # from the unrejected mask (verl)
        weighted = w * lp
        if objective.is_batch_normalize:
            is_weights = _weight_sums(objective, w, m)
    m = _trained_mask(objective, scores, m, log_ratio)
    tokens = m.sum(-1)  # (n,)
    k = objective.sequence_factor(tokens.detach())
    selected = _entropy_selected(objective, scores, m)  # the tokens of S_i and of the entropy bonus
    score = k * (weighted * selected).sum(-1)
    regulariser = None
    if objective.has_regulariser_terms:
        per_token = torch.zeros_like(lp)
        if objective.entropy_coef != 0:
            if scores.entropy is None:
                raise InvalidLogprobError("entropy_coef != 0 but the policy returned no per-token entropy")
            per_token = per_token + objective.entropy_coef * scores.entropy * selected  # 0/1 masks
        if objective.needs_reference:
            if scores.ref_logprobs is None:
                raise InvalidLogprobError("kl_coef != 0 but the policy returned no reference logprobs")
            per_token = per_token - objective.kl_coef * _kl(objective, lp, scores.ref_logprobs.to(lp.dtype))
        if objective.needs_teacher:
            if teacher is None:
                raise InvalidLogprobError(
                    f"opd_coef={objective.opd_coef} needs the teacher's logprobs of every scored token, and "
                    "this batch has none; give the engine a teacher (EmbeddedEngineConfig or "
                    "VLLMEngineConfig: teacher=TeacherConfig(...))"
                )
            p = teacher.to(device=lp.device, dtype=lp.dtype)
            advantage = (
                -(lp.detach() - p) * m
            )  # (n, L): per-token OPD advantage, masked (p is 0 off the mask)
            per_token = per_token + objective.opd_coef * advantage * lp
        regulariser = k * (per_token * m).sum(-1)
    flagged = None
    if objective.off_policy_mask is not None:
        assert log_ratio is not None  # mean (e - l) over the trained tokens (TRL: its loss mask)
        flagged = ((-log_ratio * m).sum(-1) / tokens.clamp_min(1.0) > objective.off_policy_mask).cpu()
    return TrajectoryTerms(score, regulariser, tokens.detach(), stats, is_weights, flagged)


def reference_loss(
    objective: Objective,
    terms: TrajectoryTerms,
    group_ids: Sequence[Hashable],
    rewards: Sequence[float],
    failed: Sequence[bool] | None = None,
    totals: BatchTotals | None = None,
    *,
    host_fault: Sequence[bool] | None = None,
    unscorable: Sequence[bool] | None = None,
) -> Tensor:
    """L of a complete batch in one expression (one backward): the synchronous form.

    ``failed[i]``: the verdict failed (scored at the failure floor, or dropped when also
    ``host_fault[i]``, default ``failed[i]``, under ``failed="drop"``); ``unscorable[i]``: every
    reward declined it (out of the statistics, advantage 0). ``totals`` are the global counts
    (data parallel); by default this batch's own.
    """
    n = len(group_ids)
    failed = list(failed) if failed is not None else [False] * n
    host = list(host_fault) if host_fault is not None else failed
    unscored = (
        [bool(u) and not f for u, f in zip(unscorable, failed)] if unscorable is not None else [False] * n
    )
    keep = [not (f and h and objective.failed == "drop") for f, h in zip(failed, host)]
    by_group: dict[Hashable, list[int]] = {}
    for i, g in enumerate(group_ids):
        if keep[i] and not unscored[i]:
            by_group.setdefault(g, []).append(i)
    scored: dict[int, float] = {}
    for members in by_group.values():
        values = objective.scored_rewards([rewards[i] for i in members], [failed[i] for i in members])
        scored.update(zip(members, values))
    weights = terms.is_weights.tolist() if terms.is_weights is not None else [[0.0, 0.0]] * n
    groups = {g for i, g in enumerate(group_ids) if keep[i]}
    local = BatchTotals(
        groups=float(len(groups)),
        sequences=float(sum(keep)),
        tokens=float(sum(float(terms.tokens[i]) for i in range(n) if keep[i])),
        reward_count=float(len(scored)),
        reward_sum=sum(scored.values()),
        reward_sq_sum=sum(r**2 for r in scored.values()),
        is_weight_sum=sum(weights[i][0] for i in range(n) if keep[i]),
        is_weight_count=sum(weights[i][1] for i in range(n) if keep[i]),
    )
    totals = totals if totals is not None else local
    s = objective.batch_scale(totals)
    adv = torch.zeros(n, dtype=torch.float64)
    for members in by_group.values():
        adv[members] = objective.advantages(
            torch.tensor([scored[i] for i in members], dtype=torch.float64), s
        )
    if terms.flagged is not None:  # off_policy_mask: a flagged trajectory keeps A >= 0 only
        adv = torch.where(terms.flagged.to(torch.bool) & (adv < 0), torch.zeros_like(adv), adv)
    weight = torch.tensor(keep, dtype=torch.float64)
    score = terms.score
    total = (adv.to(score.device, score.dtype) * score).sum()
    if terms.regulariser is not None:
        total = total + (weight.to(score.device, score.dtype) * terms.regulariser).sum()
    d = objective.denominator(totals)
    return -total / d if d > 0 and math.isfinite(d) else total * 0.0
