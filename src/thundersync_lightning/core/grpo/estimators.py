"""Advantage estimators: a registry of group-relative, affine-in-reward advantages.

Notation: a group holds rewards r_1..r_G (float64), mu = mean(r), sigma = population std
(divide by G). Every estimator is affine in r_i with per-group coefficients:

    A_i = a_g * r_i + b_g

| name   | A_i                          | a_g             | b_g                  |
| grpo   | (r_i - mu) / (sigma + eps)   | 1/(sigma+eps)   | -mu/(sigma+eps)      |
| drgrpo | r_i - mu                     | 1               | -mu                  |
| rloo   | G/(G-1) * (r_i - mu)         | G/(G-1)         | -G*mu/(G-1)          |

Affinity is what makes streaming exact: sum_i A_i grad S_i = a_g * sum r_i grad S_i + b_g * sum grad S_i.

Each estimator is registered where it is defined (``@register_estimator(name)``, as verl's
``register_adv_est``); the set of names is the registry's (:func:`available_estimators`,
:class:`EstimatorName` is built from the built-in registrations). An estimator that divides by the
group's std declares it (``divides_by_std=True``): the objective then passes its ``std`` and
``scale`` options, and a lone member (``singleton="reward"``, mu = 0, sigma = 1) gets a_g = 1/(1+eps).
A name written ``module:function`` (YAML ``objective.estimator: my_pkg.advantages:my_estimator``) is
imported and registered under that name the first time it is asked for.

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

from ..errors import ConfigError
from ..registry import Registry
from ..user_code import import_object

__all__ = [
    "EstimatorName",
    "Coefficients",
    "register_estimator",
    "get_estimator",
    "available_estimators",
    "divides_by_std",
    "grpo_coefficients",
    "scaled_rewards",
    "unknown_estimator",
    "advantages",
]

#: (rewards float64 of shape (G,), eps) -> (a_g, b_g)
Coefficients = Callable[[torch.Tensor, float], tuple[float, float]]


_REGISTRY: Registry[Coefficients] = Registry(
    "advantage estimator",
    "register your own with thundersync_lightning.core.register_estimator, or name one as 'module:function'",
    normalize=lambda name: str(getattr(name, "value", name)).lower(),
)
#: estimators that divide by the group's std (they take the objective's ``std`` and ``scale``)
_DIVIDES_BY_STD: set[Callable[..., Any]] = set()


def register_estimator(
    name: str,
    coefficients: Coefficients | None = None,
    *,
    overwrite: bool = False,
    divides_by_std: bool = False,
) -> Any:
    """Register an affine-in-reward estimator ``(rewards, eps) -> (a_g, b_g)`` under ``name`` (a call, or
    a decorator without ``coefficients``; :class:`~thundersync_lightning.core.registry.Registry` rules).

    ``divides_by_std``: the estimator divides by the group's std; it is then called with the
    objective's ``correction`` (0: population std, 1: sample std) and ``per_group`` (``scale="group"``)
    keywords, and a lone member's a_g is 1/(1+eps) (sigma = 1)."""
    if coefficients is None:
        return lambda fn: register_estimator(name, fn, overwrite=overwrite, divides_by_std=divides_by_std)
    _REGISTRY.register(name, coefficients, overwrite=overwrite)
    if divides_by_std:
        _DIVIDES_BY_STD.add(coefficients)
    return coefficients


def get_estimator(name: str | enum.Enum) -> Coefficients:
    """The estimator registered as ``name``; a ``module:function`` name not registered yet is imported
    and registered under that name (so a YAML config can name a user's estimator)."""
    if isinstance(name, str) and ":" in name and name not in _REGISTRY:
        fn = import_object(name, "advantage estimator")
        if not callable(fn):
            raise ConfigError(
                f"advantage estimator {name!r} is a {type(fn).__name__}: name a function "
                "(rewards, eps) -> (a_g, b_g)"
            )
        register_estimator(name, fn)
    return _REGISTRY.get(name)  # type: ignore[arg-type]


def divides_by_std(name: str) -> bool:
    """Whether the estimator ``name`` was registered with ``divides_by_std=True``."""
    return get_estimator(name) in _DIVIDES_BY_STD


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


@register_estimator("grpo", divides_by_std=True)
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


@register_estimator("drgrpo")
def _drgrpo(rewards: torch.Tensor, eps: float) -> tuple[float, float]:
    r, c = scaled_rewards(rewards)
    return 1.0, float(-r.mean()) * c


@register_estimator("rloo")
def _rloo(rewards: torch.Tensor, eps: float) -> tuple[float, float]:
    g = rewards.numel()
    k = g / (g - 1)
    r, c = scaled_rewards(rewards)
    return k, float(-k * r.mean()) * c


#: The built-in estimators' names (``EstimatorName.GRPO == "grpo"``), derived from the registrations above.
EstimatorName = enum.Enum(  # type: ignore[misc]
    "EstimatorName", {name.upper(): name for name in available_estimators()}, type=str, module=__name__
)


def advantages(rewards: Sequence[float], estimator: str = "grpo", eps: float = 1e-6) -> torch.Tensor:
    """Reference advantages A_i (float64) for one group: the slow path the stream is tested against."""
    r = torch.as_tensor(list(rewards), dtype=torch.float64)
    if r.numel() <= 1 or bool((r == r[0]).all()):
        return torch.zeros_like(r)
    a, b = get_estimator(estimator)(r, eps)
    return a * r + b
