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
from collections.abc import Callable, Sequence

import torch

from ..errors import ConfigError

__all__ = [
    "EstimatorName",
    "Coefficients",
    "register_estimator",
    "get_estimator",
    "available_estimators",
    "advantages",
]

#: (rewards float64 of shape (G,), eps) -> (a_g, b_g)
Coefficients = Callable[[torch.Tensor, float], tuple[float, float]]


class EstimatorName(str, enum.Enum):
    GRPO = "grpo"
    DRGRPO = "drgrpo"
    RLOO = "rloo"


_REGISTRY: dict[str, Coefficients] = {}


def register_estimator(name: str, coefficients: Coefficients, *, overwrite: bool = False) -> Coefficients:
    """Register an affine-in-reward estimator ``(rewards, eps) -> (a_g, b_g)`` under ``name``."""
    key = str(name).lower()
    if key in _REGISTRY and not overwrite:
        raise ValueError(f"estimator {key!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[key] = coefficients
    return coefficients


def get_estimator(name: str | EstimatorName) -> Coefficients:
    key = name.value if isinstance(name, EstimatorName) else str(name).lower()
    try:
        return _REGISTRY[key]
    except KeyError:
        raise ConfigError(
            f"unknown advantage estimator {name!r}; valid names: {', '.join(sorted(_REGISTRY))} "
            "(register your own with thundersync_lightning.core.register_estimator)"
        ) from None


def available_estimators() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def _grpo(rewards: torch.Tensor, eps: float) -> tuple[float, float]:
    mu = rewards.mean()
    sigma = rewards.std(correction=0)
    scale = 1.0 / (sigma + eps)
    return float(scale), float(-mu * scale)


def _drgrpo(rewards: torch.Tensor, eps: float) -> tuple[float, float]:
    return 1.0, float(-rewards.mean())


def _rloo(rewards: torch.Tensor, eps: float) -> tuple[float, float]:
    g = rewards.numel()
    k = g / (g - 1)
    return k, float(-k * rewards.mean())


register_estimator(EstimatorName.GRPO.value, _grpo)
register_estimator(EstimatorName.DRGRPO.value, _drgrpo)
register_estimator(EstimatorName.RLOO.value, _rloo)


def advantages(rewards: Sequence[float], estimator: str = "grpo", eps: float = 1e-6) -> torch.Tensor:
    """Reference advantages A_i (float64) for one group: the slow path the stream is tested against."""
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    if r.numel() <= 1 or bool((r == r[0]).all()):
        return torch.zeros_like(r)
    a, b = get_estimator(estimator)(r, eps)
    return a * r + b
