"""Checks at the accumulator's boundary: each raises a specific error before any state changes."""

from __future__ import annotations

import math
from collections.abc import Hashable

import torch

from .errors import InvalidLogprobError, InvalidRewardError

__all__ = ["finite_reward", "finite_score", "check_scalar"]


def finite_reward(trajectory_id: Hashable, reward: float) -> float:
    try:
        value = float(reward)
    except (TypeError, ValueError):
        raise InvalidRewardError(f"reward of trajectory {trajectory_id!r} is not a number: {reward!r}") from None
    if not math.isfinite(value):
        raise InvalidRewardError(
            f"reward of trajectory {trajectory_id!r} is {value}; rewards must be finite (a NaN would "
            "poison the whole group's advantages). Map failed verdicts to a finite reward such as 0."
        )
    return value


def check_graph(trajectory_id: Hashable, logprob: torch.Tensor) -> None:
    if not logprob.requires_grad:
        raise InvalidLogprobError(
            f"trajectory {trajectory_id!r}'s logprob does not require grad; compute it from the policy's "
            "forward pass (not under torch.no_grad) so its backward reaches the parameters"
        )


def check_scalar(trajectory_id: Hashable, logprob: object) -> None:
    if not isinstance(logprob, torch.Tensor) or logprob.numel() != 1:
        raise InvalidLogprobError(
            f"logprob of trajectory {trajectory_id!r} must be a scalar tensor (the sum of its scored "
            f"tokens' log-probabilities), got {type(logprob).__name__} of shape {getattr(logprob, 'shape', None)}"
        )


def finite_score(trajectory_id: Hashable, logprob: torch.Tensor) -> float:
    check_scalar(trajectory_id, logprob)
    check_graph(trajectory_id, logprob)
    value = float(logprob.detach())
    if not math.isfinite(value):
        raise InvalidLogprobError(f"logprob of trajectory {trajectory_id!r} is {value}; it must be finite")
    return value
