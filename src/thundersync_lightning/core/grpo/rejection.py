"""Rollout rejection sampling: drop tokens or whole sequences whose engine-vs-learner divergence is
out of bounds (verl's ``rollout_corr.rollout_rs`` / ``rollout_rs_threshold``).

Notation: per scored token, d = l - e (learner minus engine log-probability, detached; verl clamps
it to [-20, 20] first, and so does this), and three per-token divergence estimates

    k1 = -d,    k2 = d^2 / 2,    k3 = exp(d) - 1 - d.

An option is ``{level}_k{n}`` with level ``token`` (each token on its own), ``seq_sum`` /
``seq_mean`` (the sum / mean over the sequence's scored tokens) or ``seq_max`` (k2, k3 only). A
``k1`` statistic is kept inside [log lo, log hi] (threshold ``"lo_hi"``; a single number u means
lo = 1/u, hi = u); a k2 / k3 statistic is kept at or below its threshold. Several comma-separated
options must all pass. A rejected token is removed from the objective as if it were never scored:
it leaves S_i, R_i and the scored-token count (a fully rejected sequence still counts under
``seq-mean-*``, as in verl's trainer). Each trajectory's mask depends on that trajectory alone,
so the rejection streams exactly.

verl divides a sequence mean by (count + 1e-8); this divides by the count (a statistic within
1e-8 relative of its threshold may fall the other way).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import torch
from torch import Tensor

from ..errors import ConfigError

__all__ = ["RejectionOption", "parse_rejection", "rejection_keep", "REJECTION_OPTIONS"]

REJECTION_OPTIONS = tuple(
    f"{level}_k{n}" for level in ("token", "seq_sum", "seq_mean") for n in (1, 2, 3)
) + ("seq_max_k2", "seq_max_k3")
_SAFETY_BOUND = 20.0


@dataclass(frozen=True, slots=True)
class RejectionOption:
    name: str
    lower: float | None  # k1 only: the bound on the statistic itself (log lo)
    upper: float  # k1: log hi; k2 / k3: the threshold


@lru_cache(maxsize=64)
def parse_rejection(rs: str, threshold: str | float | None) -> tuple[RejectionOption, ...]:
    """The options of an ``rs`` string with their thresholds (one shared, or one per option)."""
    names = list(dict.fromkeys(o.strip() for o in str(rs).split(",") if o.strip()))
    unknown = [n for n in names if n not in REJECTION_OPTIONS]
    if not names or unknown:
        raise ConfigError(
            f"rs={rs!r}: options must be comma-separated names from {', '.join(REJECTION_OPTIONS)}"
        )
    if threshold is None or isinstance(threshold, bool):
        raise ConfigError(f"rs={rs!r} needs rs_threshold (one number, 'lo_hi' for k1, or one per option)")
    specs = [p.strip() for p in str(threshold).split(",") if p.strip()]
    if len(specs) == 1:
        specs = specs * len(names)
    if len(specs) != len(names):
        raise ConfigError(f"rs_threshold={threshold!r}: give one threshold or one per option of rs={rs!r}")
    return tuple(_option(n, s) for n, s in zip(names, specs))


def _option(name: str, spec: str) -> RejectionOption:
    try:
        parts = [float(p) for p in spec.split("_")] if name.endswith("k1") else [float(spec)]
    except ValueError:
        raise ConfigError(
            f"rs_threshold {spec!r} of option {name!r} is not a number (k1 takes 'lo_hi')"
        ) from None
    if len(parts) == 1 and name.endswith("k1"):
        parts = [1.0 / parts[0] if parts[0] > 0 else -1.0, parts[0]]
    if len(parts) != (2 if name.endswith("k1") else 1) or any(
        not (p > 0 and math.isfinite(p)) for p in parts
    ):
        raise ConfigError(
            f"rs_threshold {spec!r} of option {name!r} must be positive ('lo_hi' with lo <= hi for k1)"
        )
    if name.endswith("k1"):
        if parts[0] > parts[1]:
            raise ConfigError(f"rs_threshold {spec!r} of option {name!r}: lo must be <= hi")
        return RejectionOption(name, math.log(parts[0]), math.log(parts[1]))
    return RejectionOption(name, None, parts[0])


def rejection_keep(options: tuple[RejectionOption, ...], log_ratio: Tensor, mask: Tensor) -> Tensor:
    """(n, L) float keep mask (1 kept, 0 rejected) from ``log_ratio`` = l - e (detached) and the scored
    ``mask`` (float, (n, L)); positions off the mask are returned as 0."""
    d = log_ratio.clamp(-_SAFETY_BOUND, _SAFETY_BOUND)
    per_token = {"k1": -d, "k2": 0.5 * d * d, "k3": torch.exp(d) - 1.0 - d}
    keep = mask.clone()
    count = mask.sum(-1, keepdim=True)  # (n, 1)
    for opt in options:
        level, k = opt.name.rsplit("_", 1)
        stat = per_token[k]
        if level == "seq_sum":
            stat = (stat * mask).sum(-1, keepdim=True)
        elif level == "seq_mean":
            stat = (stat * mask).sum(-1, keepdim=True) / count.clamp_min(1.0)
        elif level == "seq_max":
            stat = torch.where(mask > 0, stat, torch.full_like(stat, -math.inf)).amax(-1, keepdim=True)
            stat = torch.where(count > 0, stat, torch.zeros_like(stat))
        ok = stat <= opt.upper
        if opt.lower is not None:
            ok = ok & (stat >= opt.lower)
        keep = keep * ok.to(keep.dtype).expand_as(keep)
    return keep
