"""Advantage estimators: a registry of group-relative, affine-in-reward advantages.

Notation: a group holds rewards r_1..r_G (float64), mu = mean(r), sigma = population std
(divide by G). Every estimator is affine in r_i with per-group coefficients:

    A_i = a_g * r_i + b_g

| name   | A_i                          | a_g             | b_g                  |
| grpo   | (r_i - mu) / (sigma + eps)   | 1/(sigma+eps)   | -mu/(sigma+eps)      |
| drgrpo | r_i - mu                     | 1               | -mu                  |
| rloo   | G/(G-1) * (r_i - mu)         | G/(G-1)         | -G*mu/(G-1)          |

Affinity is what makes streaming exact: sum_i A_i grad S_i = a_g * sum r_i grad S_i + b_g * sum grad S_i.
Two invariants hold for every estimator, registered or built in, and are enforced by the caller
(:class:`~thundersync_lightning.core.accumulator.streaming.StreamingGRPO`), not by each estimator: a group of
one trajectory and a group whose rewards are all equal have A_i = 0 exactly.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..registry import Registry

__all__ = [
    "EstimatorName",
    "Coefficients",
    "register_estimator",
    "get_estimator",
    "available_estimators",
    "grpo_coefficients",
    "scaled_rewards",
    "unknown_estimator",
    "advantages",
]

#: (rewards float64 of shape (G,), eps) -> (a_g, b_g)
Coefficients = Callable[[torch.Tensor, float], tuple[float, float]]


class EstimatorName(str, enum.Enum):
    GRPO = "grpo"
    DRGRPO = "drgrpo"
    RLOO = "rloo"


_REGISTRY: Registry[Coefficients] = Registry(
    "advantage estimator",
    "register your own with thundersync_lightning.core.register_estimator",
    normalize=lambda name: str(getattr(name, "value", name)).lower(),
)


def register_estimator(name: str, coefficients: Coefficients | None = None, *, overwrite: bool = False) -> Any:
    """Register an affine-in-reward estimator ``(rewards, eps) -> (a_g, b_g)`` under ``name`` (a call, or
    a decorator without ``coefficients``; :class:`~thundersync_lightning.core.registry.Registry` rules)."""
    return _REGISTRY.register(name, coefficients, overwrite=overwrite)


def get_estimator(name: str | EstimatorName) -> Coefficients:
    return _REGISTRY.get(name)  # type: ignore[arg-type]


def unknown_estimator(name: str) -> str:
    """The message for an unknown estimator name (valid names, did-you-mean)."""
    return _REGISTRY.unknown(name)


def available_estimators() -> tuple[str, ...]:
    return _REGISTRY.names()


def scaled_rewards(rewards: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(rewards / c, c) with c = 2^k the smallest power of two >= max|r_i| (c = 1 when every |r_i| <= 1).

    Dividing by a power of two is exact in float64, so every mean, difference, square and square root
    of the scaled rewards is the unscaled one's times a power of two bit for bit, and none of them
    overflows: the group statistics of any finite rewards (even -1e308 beside 1e308) are finite.
    """
    m = float(rewards.abs().max()) if rewards.numel() else 0.0
    if m <= 1.0:
        return rewards, 1.0
    c = math.ldexp(1.0, min(math.frexp(m)[1], 1023))  # m < 2^k; 2^1023 is the largest power of two
    return rewards / c, c


def grpo_coefficients(rewards: torch.Tensor, eps: float, *, correction: int = 0, per_group: bool = True):
    """GRPO: A_i = (r_i - mu) / (sigma + eps) (``correction`` 1: sample std); ``per_group=False``
    (the objective's ``scale="batch"``): r_i - mu, scaled by the batch at the barrier.

    Computed on the rewards scaled by c (:func:`scaled_rewards`): a_g = 1 / (sigma/c + eps/c) / c,
    b_g = -(mu/c) / (sigma/c + eps/c), the same numbers bit for bit where nothing overflows."""
    r, c = scaled_rewards(rewards)
    mu = float(r.mean())
    if not per_group:
        return 1.0, -mu * c
    d = float(r.std(correction=correction)) + eps / c
    return 1.0 / d / c, -mu / d


def _drgrpo(rewards: torch.Tensor, eps: float) -> tuple[float, float]:
    r, c = scaled_rewards(rewards)
    return 1.0, float(-r.mean()) * c


def _rloo(rewards: torch.Tensor, eps: float) -> tuple[float, float]:
    g = rewards.numel()
    k = g / (g - 1)
    r, c = scaled_rewards(rewards)
    return k, float(-k * r.mean()) * c


register_estimator(EstimatorName.GRPO.value, grpo_coefficients)
register_estimator(EstimatorName.DRGRPO.value, _drgrpo)
register_estimator(EstimatorName.RLOO.value, _rloo)


def advantages(rewards: Sequence[float], estimator: str = "grpo", eps: float = 1e-6) -> torch.Tensor:
    """Reference advantages A_i (float64) for one group: the slow path the stream is tested against."""
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    if r.numel() <= 1 or bool((r == r[0]).all()):
        return torch.zeros_like(r)
    a, b = get_estimator(estimator)(r, eps)
    return a * r + b
