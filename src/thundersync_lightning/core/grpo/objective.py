"""The training objective, defined once: every mode and every path reads it from here.

Notation: a step trains on trajectories i in groups g. Trajectory i has reward r_i, scored
tokens t = 1..T_i with learner log-probabilities l_it (a graph to theta), engine (sampling)
log-probabilities e_it, reference log-probabilities q_it and entropies H_it. G_g is the number
of kept members of group g.

Verdicts: a member is *graded* (its reward r_i), *failed* (the episode or its reward failed: it
raised, hung, returned NaN, inf, None where not allowed, a string, or a value beyond
``max_abs_reward``) or *unscorable* (every reward function declined it: TRL's ``None``).

- A failure scores the *floor* f_g: ``failure_reward`` when set (a constant below every reward the
  task can give, known at once), else the worst graded reward of its group (known when the group's
  last verdict lands; a group of failures alone has f_g = 0 and all A_i = 0). Since a_g >= 0, a
  failure's advantage is never above any graded member's: failing never beats a wrong answer.
  Under ``failed="drop"`` a failure no action of the episode can have caused (a host fault) leaves
  its group and every count instead.
- An unscorable member leaves its group's statistics (mu, sigma, and the batch moments of
  ``scale="batch"``); its advantage is 0; it still counts in D and its R_i trains (TRL 1.16:
  its reward is NaN under ``nanmean``/``nanstd``, its advantage ``nan_to_num``'d to 0, its
  tokens kept in the loss mask).

    A_i   = (a_g r_i + b_g) * s                       advantage, affine in r_i per group
    w_it  = importance weight from exp(l_it - e_it)   detached (1 without correction)
    k_i   = 1 | 1/T_i | 1/norm_tokens                 per-sequence factor of ``loss_agg``
    S_i   = k_i sum_t w_it l_it                       reward-weighted score
    R_i   = k_i sum_t (entropy_coef H_it - kl_coef KL_k(l_it, q_it)
                       - opd_coef [l_it - p_it] l_it)  regulariser (no reward)
    L     = -(1/D) sum_i (reward_coef A_i S_i + R_i)

with D the global number of groups (``group-sum``), sequences (``seq-mean-*``) or scored tokens
(``token-mean``), all counted over every rank, and s = 1 except for ``scale="batch"`` where
s = 1/(std of all kept rewards of the step + eps): a global scalar known at the barrier, applied
to the folded sums there, which keeps streaming exact. [x] is x detached (a constant). At ratio 1 (one update
per batch) PPO clipping is inert and grad L is the GRPO policy gradient of verl and TRL for the matching
settings (see ``docs/objective.md``).

On-policy distillation (OPD): p_it is a teacher's log-probability of the student's own sampled
token, computed by the rollout engine at the sampling temperature. On the student's samples
grad KL(student || teacher) = E[(l - p) grad l] (the pathwise term E[grad l] is 0), so the
OPD part of R_i is the per-token advantage -(l_it - p_it), detached, times l_it: reward-free,
it streams like KL and entropy. Its value is a surrogate; its gradient is the reverse KL's.
``reward_coef`` scales every A_i (0: no reward term at all, OPD alone; its S_i backward passes
are skipped).

Advantages (float64, kept members of one group, mu = mean, sigma = std with ``std``'s divisor):

- ``grpo`` (and any estimator registered ``divides_by_std``): (r - mu) / (sigma + eps) for
  ``scale="group"``, r - mu for ``"none"``, and (r - mu) * s for ``"batch"``; any other estimator
  gives its own (a_g, b_g) (times s for batch).
- all kept rewards equal (G >= 2): A = 0 exactly. G = 1: ``singleton="zero"`` gives A = 0,
  ``"reward"`` uses mu = 0, sigma = 1 (verl): A = r/(1+eps) for a std-dividing estimator under
  ``scale="group"``, else r (times s).
  "Kept rewards" are those of graded and failed members (failures at the floor), G their count.
- The built-in estimators compute mu and sigma on rewards scaled by a power of two (exact), so no
  finite reward makes them overflow; a non-finite a_g, b_g, A_i or s raises
  :class:`~thundersync_lightning.core.errors.NonFiniteAdvantageError` (never a NaN step).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

import torch

from ..errors import ConfigError, NonFiniteAdvantageError
from .estimators import divides_by_std, get_estimator
from .rejection import RejectionOption, parse_rejection
from .totals import BatchTotals

__all__ = [
    "Objective",
    "BatchTotals",
    "LossAgg",
    "ISCorrection",
    "PRESETS",
]

log = logging.getLogger(__name__)

Std = Literal["population", "sample"]
Scale = Literal["group", "batch", "none"]
LossAgg = Literal[
    "group-sum", "seq-mean-token-sum", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"
]
Singleton = Literal["zero", "reward"]
KLEstimator = Literal["k1", "k2", "k3", "k3_corrected"]
ISCorrection = Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
Failed = Literal["floor", "drop"]

_CHOICES: dict[str, tuple[str, ...]] = {
    "std": ("population", "sample"),
    "scale": ("group", "batch", "none"),
    "loss_agg": (
        "group-sum",
        "seq-mean-token-sum",
        "token-mean",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
    ),
    "singleton": ("zero", "reward"),
    "kl_estimator": ("k1", "k2", "k3", "k3_corrected"),
    "is_correction": ("none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"),
    "failed": ("floor", "drop"),
}


@dataclass(frozen=True, slots=True)
class Objective:
    """What a step minimises (see the module docstring for the formula).

    Args:
        estimator: advantage estimator (``grpo``, ``drgrpo``, ``rloo``, a registered one, or a
            ``module:function`` imported and registered under that name).
        std: ``population`` (divide by G) or ``sample`` (G-1, ``torch.std``: verl, TRL).
        eps: std guard.
        scale: ``group`` (per-group std), ``batch`` (std of every kept reward of the step, all
            ranks), ``none`` (no std division; grpo becomes Dr. GRPO).
        loss_agg: the normaliser D and per-sequence factor (verl's ``loss_agg_mode`` names, plus
            ``group-sum``: divide by the number of groups).
        norm_tokens: the constant of ``seq-mean-token-sum-norm`` (Dr. GRPO / TRL ``dr_grpo``:
            the maximum completion length).
        singleton: advantage of a group of one kept trajectory: ``zero`` or ``reward`` (verl).
        kl_coef, kl_estimator: KL to the reference policy (the initial weights); k1 = l - q,
            k2 = (l - q)^2 / 2, k3 = exp(q - l) - (q - l) - 1 (verl ``low_var_kl``; TRL ``beta`` with
            ``use_bias_correction_kl=False``), ``k3_corrected`` = k3 exp(l - [l]): k3's value with
            gradient (l - q) grad l, k2's (TRL ``beta`` with ``use_bias_correction_kl=True``).
        entropy_coef: entropy bonus.
        is_correction, is_cap: importance weights from exp(l - e) (TRL semantics): ``token_*``
            per token, ``sequence_*`` one weight exp(sum_t (l - e)) per sequence; ``truncate``
            clamps at ``is_cap``, ``mask`` zeroes weights above it. Applied to the reward term.
        is_batch_normalize: divide every importance weight by their mean over the step (verl
            ``rollout_is_batch_normalize``): over every scored token for ``token_*``, over the
            sequences with a scored token for ``sequence_*``, after truncation or masking, before
            rejection (``rs``), no division when the mean is <= 1e-8. The weights multiply the
            reward term only, so the mean is one more global scalar applied at the barrier like
            the batch scale s: each trajectory adds its weights' sum and count to the step's
            counts, and s becomes s / mean (R terms are kept apart from s, as under
            ``scale="batch"``).
        off_policy_mask: TRL's ``off_policy_mask_threshold`` delta (DeepSeek-V3.2's off-policy
            sequence mask): a trajectory whose mean over scored tokens of (e - l) exceeds delta
            (*flagged*) keeps its reward term only where A_i >= 0. The sign of A_i is known when
            its group closes, so a flagged trajectory's gradient is kept apart, one sum per
            (group, reward), and folded with max(A, 0): exact in streaming (not with the boundary
            cut). None: off.
        top_entropy_quantile: train the reward term on the highest-entropy tokens only (TRL
            ``top_entropy_quantile``, "80/20" token selection): a scored token takes part in S_i
            (and in the entropy bonus) when its entropy is at least the (1 - q)-quantile of the
            entropies of every scored token of the step; D and KL keep every token. The threshold
            depends on the whole step, so it cannot stream exactly: refused in streaming and async,
            applied in sync (one no-grad forward of the step's trajectories first).
        is_min: lower bound of the importance weight (None: none): ``truncate`` clamps below it,
            ``mask`` zeroes a weight below it (TRL ``vllm_importance_sampling_clip_min``; with
            ``token_mask`` it is verl's two-sided IcePop threshold ``"lower_upper"``).
        rs, rs_threshold: rollout rejection sampling (verl ``rollout_rs`` / ``rollout_rs_threshold``,
            same names and threshold syntax, :mod:`~thundersync_lightning.core.grpo.rejection`): tokens or
            sequences whose engine-vs-learner divergence is out of bounds leave S_i, R_i and the
            token count. Per trajectory, so it streams exactly.
        overlong_filter: a trajectory that hit a length limit (``finish_reason="length"``, or an action
            that reached ``max_action_tokens`` without its end-of-turn token) trains nothing: its tokens leave
            S_i, R_i and the token count, its reward still counts in its group's statistics and its sequence
            under ``seq-mean-*`` (DAPO's overlong filtering; TRL ``mask_truncated_completions``).
        overlong_buffer, overlong_max_tokens, overlong_penalty: DAPO's soft overlong punishment
            (Yu et al., 2025, eq. 13; verl's ``reward_model.overlong_buffer``): with L = the
            trajectory's scored tokens, L_max = ``overlong_max_tokens`` and a window of
            B = ``overlong_buffer`` tokens, the reward gets
            ``-overlong_penalty * clamp((L - (L_max - B)) / B, 0, 1)``: nothing up to L_max - B,
            a linear penalty over the window, the full penalty beyond L_max (verl: the same up to
            L_max, which its responses never exceed). Applied to the reward the group statistics
            see (:meth:`shaped_reward`), before any advantage; both fields or neither.
        failed: ``floor`` (a failed rollout scores the failure floor, see ``failure_reward``) or
            ``drop`` (a rollout failed by a host fault, ``RewardReady.host_fault``, leaves its
            group's baseline and every count; exact, since nothing of it is folded before its
            verdict; a failure the episode's own actions may have caused still scores the floor, so
            crashing the environment never beats failing the task).
        failure_reward: the floor f_g a failure scores. None (the default): the worst graded reward
            of its group, known when the group's last verdict lands (a failure's gradient waits in
            one more sum of its group until then: at most one more parameter-sized buffer per open
            group that has a failure). A number: that constant, known at once (nothing waits); it
            must lie below every reward the task can give (a graded reward below it raises
            :class:`~thundersync_lightning.core.errors.InvalidRewardError`).
        max_abs_reward: a verdict with |r| above it is refused: it becomes a failure whose reason
            names the value and this bound (it then scores the floor). Keeps the step's sums in
            range of the gradient dtype; any finite value > 0 (``math.inf``: no bound).
        opd_coef: on-policy distillation: weight of the per-token advantage -(l - p) on the
            student's sampled tokens, p the teacher's log-probabilities shipped with each
            trajectory by the engine (reverse KL to the teacher). Needs an engine with a teacher.
        reward_coef: weight of the reward term (every A_i is multiplied by it); 0 trains the
            regulariser terms only (e.g. OPD alone) and skips every S_i backward pass.
    """

    estimator: str = "grpo"
    std: Std = "population"
    eps: float = 1e-6
    scale: Scale = "group"
    loss_agg: LossAgg = "group-sum"
    norm_tokens: float | None = None
    singleton: Singleton = "zero"
    kl_coef: float = 0.0
    kl_estimator: KLEstimator = "k3"
    entropy_coef: float = 0.0
    is_correction: ISCorrection = "none"
    is_cap: float = 3.0
    is_min: float | None = None
    is_batch_normalize: bool = False
    top_entropy_quantile: float = 1.0
    off_policy_mask: float | None = None
    rs: str | None = None
    rs_threshold: str | float | None = None
    overlong_filter: bool = False
    overlong_buffer: int | None = None
    overlong_max_tokens: int | None = None
    overlong_penalty: float = 1.0
    failed: Failed = "floor"
    failure_reward: float | None = None
    max_abs_reward: float = 1e6
    opd_coef: float = 0.0
    reward_coef: float = 1.0

    def __post_init__(self) -> None:
        problems = []
        name = str(getattr(self.estimator, "value", self.estimator))
        object.__setattr__(
            self, "estimator", name if ":" in name else name.lower()
        )  # module paths keep their case
        try:
            get_estimator(self.estimator)  # imports a ``module:function`` estimator
        except ConfigError as err:
            problems.append(str(err))
        for name, choices in _CHOICES.items():
            if getattr(self, name) not in choices and (name, getattr(self, name)) != ("failed", "zero"):
                problems.append(f"{name}={getattr(self, name)!r} is not one of {choices}")
        if self.failed == "zero":
            problems.append(
                "failed='zero' is gone: a failure trained as 0.0 outscored every graded answer where rewards "
                "are <= 0 (penalties); failed='floor' (the default) scores a failure as the worst graded "
                "reward of its group, or set failure_reward below every reward the task can give"
            )
        if self.failure_reward is not None and not (
            isinstance(self.failure_reward, (int, float)) and math.isfinite(self.failure_reward)
        ):
            problems.append(f"failure_reward must be None or a finite number, got {self.failure_reward!r}")
        if not (isinstance(self.max_abs_reward, (int, float)) and self.max_abs_reward > 0):
            problems.append(
                f"max_abs_reward must be a number > 0 (math.inf: no bound), got {self.max_abs_reward!r}"
            )
        elif self.failure_reward is not None and abs(self.failure_reward) > self.max_abs_reward:
            problems.append(
                f"failure_reward={self.failure_reward} is beyond max_abs_reward={self.max_abs_reward}"
            )
        for name in ("eps", "kl_coef", "entropy_coef", "opd_coef", "reward_coef"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                problems.append(f"{name} must be a finite number >= 0, got {value!r}")
        if not (isinstance(self.is_cap, (int, float)) and self.is_cap > 0):
            problems.append(f"is_cap must be > 0, got {self.is_cap!r}")
        elif self.is_min is not None and not (
            isinstance(self.is_min, (int, float)) and 0 <= self.is_min <= self.is_cap
        ):
            problems.append(
                f"is_min must be None or a number in [0, is_cap={self.is_cap}], got {self.is_min!r}"
            )
        if self.rs is not None:
            try:
                parse_rejection(self.rs, self.rs_threshold)
            except ConfigError as err:
                problems.append(str(err))
        elif self.rs_threshold is not None:
            problems.append(
                f"rs_threshold={self.rs_threshold!r} is only used with rs (rejection sampling options)"
            )
        if (self.overlong_buffer is None) != (self.overlong_max_tokens is None):
            problems.append(
                "overlong_buffer and overlong_max_tokens go together (DAPO's window and maximum length)"
            )
        elif self.overlong_buffer is not None and not (0 < self.overlong_buffer <= self.overlong_max_tokens):
            problems.append(
                f"overlong_buffer must be in 1..overlong_max_tokens, got {self.overlong_buffer} and "
                f"{self.overlong_max_tokens}"
            )
        if not (
            isinstance(self.overlong_penalty, (int, float))
            and math.isfinite(self.overlong_penalty)
            and self.overlong_penalty >= 0
        ):
            problems.append(f"overlong_penalty must be a finite number >= 0, got {self.overlong_penalty!r}")
        if not (isinstance(self.top_entropy_quantile, (int, float)) and 0 < self.top_entropy_quantile <= 1):
            problems.append(f"top_entropy_quantile must be in (0, 1], got {self.top_entropy_quantile!r}")
        if self.off_policy_mask is not None and not (
            isinstance(self.off_policy_mask, (int, float)) and math.isfinite(self.off_policy_mask)
        ):
            problems.append(f"off_policy_mask must be None or a finite number, got {self.off_policy_mask!r}")
        if not isinstance(self.is_batch_normalize, bool):
            problems.append(f"is_batch_normalize must be True or False, got {self.is_batch_normalize!r}")
        elif self.is_batch_normalize and self.is_correction == "none":
            problems.append("is_batch_normalize needs importance weights: set is_correction")
        if not isinstance(self.overlong_filter, bool):
            problems.append(f"overlong_filter must be True or False, got {self.overlong_filter!r}")
        if self.loss_agg == "seq-mean-token-sum-norm":
            if self.norm_tokens is None or not self.norm_tokens > 0:
                problems.append(
                    "loss_agg='seq-mean-token-sum-norm' needs norm_tokens > 0 (the constant of Dr. GRPO, "
                    f"e.g. the maximum completion length), got {self.norm_tokens!r}"
                )
        elif self.norm_tokens is not None:
            problems.append(
                f"norm_tokens is only used by loss_agg='seq-mean-token-sum-norm', not {self.loss_agg!r}"
            )
        if problems:
            raise ConfigError("invalid Objective: " + "; ".join(problems))

    # ------------------------------------------------------------------ construction
    @staticmethod
    def preset(name: str, **overrides: Any) -> Objective:
        """``thundersync`` (the defaults), ``verl`` (verl 0.9 GRPO) or ``trl`` (TRL 1.16 GRPOTrainer)."""
        try:
            base = PRESETS[str(name).lower()]
        except KeyError:
            raise ConfigError(
                f"unknown objective preset {name!r}; valid presets: {', '.join(PRESETS)}"
            ) from None
        return replace(base, **overrides) if overrides else base

    @staticmethod
    def of(value: Objective | str | Mapping[str, Any] | None) -> Objective:
        """An Objective from itself, a preset name, a mapping of fields (``preset`` allowed) or None."""
        if value is None:
            return Objective()
        if isinstance(value, Objective):
            return value
        if isinstance(value, str):
            return Objective.preset(value)
        if isinstance(value, Mapping):
            data = dict(value)
            unknown = sorted(set(data) - {f.name for f in fields(Objective)} - {"preset"})
            if unknown:
                valid = ", ".join(f.name for f in fields(Objective))
                raise ConfigError(f"unknown Objective field(s) {unknown}; valid fields: preset, {valid}")
            if data.get("failed") == "zero":  # the old default, in every checkpoint written before the floor
                log.warning(
                    "objective failed='zero' (a failure trained as 0.0, which outscored every graded answer "
                    "where rewards are <= 0) is read as failed='floor': a failure scores the "
                    "worst graded reward of its group"
                )
                data["failed"] = "floor"
            preset = data.pop("preset", None)
            return Objective.preset(preset, **data) if preset is not None else Objective(**data)
        raise ConfigError(
            f"an objective must be an Objective, a preset name or a mapping, got {type(value).__name__}"
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # ------------------------------------------------------------------ what it needs
    @property
    def needs_engine_logprobs(self) -> bool:
        return self.is_correction != "none" or self.rs is not None or self.off_policy_mask is not None

    @property
    def rejection(self) -> tuple[RejectionOption, ...]:
        """The parsed ``rs`` options (empty without rejection sampling)."""
        return parse_rejection(self.rs, self.rs_threshold) if self.rs is not None else ()

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef != 0

    @property
    def needs_entropy(self) -> bool:
        """The policy must return per-token entropies (the bonus, or the entropy token selection)."""
        return self.entropy_coef != 0 or self.selects_tokens_by_entropy

    @property
    def selects_tokens_by_entropy(self) -> bool:
        """``top_entropy_quantile`` < 1: a step-wide threshold, known only once every trajectory landed."""
        return self.top_entropy_quantile < 1

    @property
    def needs_teacher(self) -> bool:
        """OPD is on: every scored token needs the teacher's log-probability p_it."""
        return self.opd_coef != 0

    @property
    def has_regulariser_terms(self) -> bool:
        """Whether R_i (KL, entropy, OPD) exists: the regulariser terms, whose gradient needs no reward."""
        return self.needs_reference or self.entropy_coef != 0 or self.needs_teacher

    @property
    def needs_token_detail(self) -> bool:
        """False when S_i = sum of scored-token logprobs and D needs no token count."""
        return (
            self.loss_agg not in ("group-sum", "seq-mean-token-sum")
            or self.needs_engine_logprobs
            or self.overlong_filter
            or self.selects_tokens_by_entropy
            or self.has_regulariser_terms
        )

    @property
    def shapes_rewards(self) -> bool:
        """The reward depends on the trajectory's length (DAPO's overlong punishment is on)."""
        return self.overlong_buffer is not None

    def shaped_reward(self, reward: float, scored_tokens: int) -> float:
        """The reward the objective trains on: ``reward`` plus the overlong penalty (see ``overlong_*``)."""
        if self.overlong_buffer is None or self.overlong_max_tokens is None:
            return reward
        start = self.overlong_max_tokens - self.overlong_buffer
        excess = min(max((scored_tokens - start) / self.overlong_buffer, 0.0), 1.0)
        return reward - self.overlong_penalty * excess

    # ------------------------------------------------------------------ verdicts
    def refused_reward(self, reward: float) -> str | None:
        """Why a graded reward is refused (it then counts as a failure), or None:
        beyond ``max_abs_reward``."""
        if abs(reward) > self.max_abs_reward:
            return (
                f"reward {reward!r} is beyond max_abs_reward={self.max_abs_reward:g} (refused as a failure; "
                "raise Objective.max_abs_reward if the task's rewards are that large)"
            )
        return None

    def failure_floor(self, graded: Sequence[float]) -> float:
        """f_g, the reward a failure of a group scores: ``failure_reward``, else the worst of the
        group's ``graded`` rewards (0.0 when it has none: its failures are then all equal)."""
        if self.failure_reward is not None:
            return float(self.failure_reward)
        return min(graded) if graded else 0.0

    def scored_rewards(self, rewards: Sequence[float], failed: Sequence[bool]) -> list[float]:
        """One group's kept rewards as its statistics see them (unscorable and dropped members left
        out by the caller): each failure's reward replaced by the floor f_g."""
        floor = self.failure_floor([float(r) for r, f in zip(rewards, failed) if not f])
        return [floor if f else float(r) for r, f in zip(rewards, failed)]

    # ------------------------------------------------------------------ advantages
    def coefficients(self, rewards: torch.Tensor) -> tuple[float, float]:
        """(a_g, b_g) of one group from its kept rewards (float64, shape (G,)), before the batch scale,
        times ``reward_coef``.

        Zero for an all-equal group of G >= 2, for a singleton under ``singleton="zero"`` and for
        every group when ``reward_coef`` is 0. Raises :class:`NonFiniteAdvantageError` when a_g,
        b_g or an advantage a_g r_i + b_g is not finite (a registered estimator, or rewards so
        large that r_i - mu overflows).
        """
        if self.reward_coef == 0:
            return 0.0, 0.0
        a, b = self._estimator_coefficients(rewards)
        if self.reward_coef != 1:
            a, b = a * self.reward_coef, b * self.reward_coef
        if (a, b) != (0.0, 0.0) and rewards.numel():
            extremes = (float(rewards.min()), float(rewards.max()))
            if not all(math.isfinite(v) for v in (a, b, *(a * r + b for r in extremes))):
                raise NonFiniteAdvantageError(
                    f"the {self.estimator} advantage of a group with rewards in [{extremes[0]:g}, "
                    f"{extremes[1]:g}] is not finite (a_g={a!r}, b_g={b!r}); the step is refused rather than "
                    "made NaN. Bound the rewards (Objective.max_abs_reward) or fix the estimator"
                )
        return a, b

    def _estimator_coefficients(self, rewards: torch.Tensor) -> tuple[float, float]:
        g = rewards.numel()
        if g == 0:
            return 0.0, 0.0
        grpo = divides_by_std(self.estimator)
        if g == 1:
            if self.singleton == "zero":
                return 0.0, 0.0
            return (1.0 / (1.0 + self.eps) if grpo and self.scale == "group" else 1.0), 0.0
        if bool((rewards == rewards[0]).all()):
            return 0.0, 0.0
        # an estimator that divides by the std takes the objective's std and scale
        options = {"correction": self._correction, "per_group": self.scale == "group"} if grpo else {}
        return get_estimator(self.estimator)(rewards, self.eps, **options)

    def advantages(self, rewards: torch.Tensor, batch_scale: float = 1.0) -> torch.Tensor:
        """A_i of one group's kept rewards (the slow path the stream is tested against)."""
        r = torch.as_tensor(rewards, dtype=torch.float64)
        a, b = self.coefficients(r)
        if a == 0.0 and b == 0.0:
            return torch.zeros_like(r)
        return (a * r + b) * batch_scale

    @property
    def _correction(self) -> int:
        return 1 if self.std == "sample" else 0

    @property
    def scales_at_barrier(self) -> bool:
        """The reward term gets a global factor at the barrier (batch std or IS normaliser): R apart."""
        return self.scale == "batch" or self.is_batch_normalize

    def batch_scale(self, totals: BatchTotals) -> float:
        """s: 1/(std of every kept reward of the step + eps) for ``scale="batch"``, else 1; divided
        by the mean importance weight under ``is_batch_normalize``."""
        s = self._reward_scale(totals)
        if self.is_batch_normalize and totals.is_weight_count > 0:
            mean = totals.is_weight_sum / totals.is_weight_count
            if mean > 1e-8:
                s = s / mean
        return s

    def _reward_scale(self, totals: BatchTotals) -> float:
        if self.scale != "batch":
            return 1.0
        n = totals.reward_count
        if n - self._correction <= 0:
            return 1.0 / (1.0 + self.eps) if n > 0 else 1.0
        mean = totals.reward_sum / n
        var = max(0.0, (totals.reward_sq_sum - n * mean * mean) / (n - self._correction))
        s = 1.0 / (math.sqrt(var) + self.eps)
        if not all(math.isfinite(v) for v in (s, mean, totals.reward_sq_sum)):
            raise NonFiniteAdvantageError(
                f"the batch scale of scale='batch' is not finite (reward sum {totals.reward_sum!r}, sum of "
                f"squares {totals.reward_sq_sum!r} over {n:g} rewards); the step is refused rather than made "
                "NaN. Bound the rewards (Objective.max_abs_reward)"
            )
        return s

    # ------------------------------------------------------------------ normalisation
    def sequence_factor(self, tokens: torch.Tensor) -> torch.Tensor:
        """k_i from each sequence's scored-token count (shape (n,), float)."""
        if self.loss_agg == "seq-mean-token-mean":
            return torch.where(tokens > 0, 1.0 / tokens.clamp_min(1.0), torch.zeros_like(tokens))
        if self.loss_agg == "seq-mean-token-sum-norm":
            assert self.norm_tokens is not None
            return torch.full_like(tokens, 1.0 / self.norm_tokens)
        return torch.ones_like(tokens)

    def denominator(self, totals: BatchTotals) -> float:
        """D: groups, sequences or scored tokens of the whole step (0 when nothing was kept)."""
        if self.loss_agg == "group-sum":
            return totals.groups
        if self.loss_agg == "token-mean":
            return totals.tokens
        return totals.sequences


PRESETS: dict[str, Objective] = {
    "thundersync": Objective(),
    # verl 0.9: GRPO advantage with torch.std (G-1) and eps 1e-6, token-mean aggregation, a group of
    # one gets mean 0 / std 1, KL loss and entropy off by default.
    "verl": Objective(estimator="grpo", std="sample", eps=1e-6, loss_agg="token-mean", singleton="reward"),
    # TRL 1.16 GRPOTrainer: scale_rewards="group" (std with G-1, eps 1e-4), loss_type="dapo" (token
    # mean over the global batch), beta 0, vLLM IS correction "sequence_mask" with cap 3; beta > 0
    # takes TRL's bias-corrected k3 (use_bias_correction_kl=True).
    "trl": Objective(
        estimator="grpo",
        std="sample",
        eps=1e-4,
        scale="group",
        loss_agg="token-mean",
        is_correction="sequence_mask",
        is_cap=3.0,
        kl_estimator="k3_corrected",
    ),
}
