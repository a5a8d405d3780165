"""Checks at the accumulator's boundary: each raises a specific error before any state changes."""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import torch

from ..errors import InvalidLogprobError, InvalidRewardError, PolicyChangedError

__all__ = ["finite_reward", "finite_score", "check_scalar", "argument_problems", "check_unchanged"]


def argument_problems(
    params: Sequence[torch.Tensor], objective_given: bool, estimator: str | None, eps: float | None
) -> list[str]:
    """Every problem with a StreamingGRPO's parameters and objective arguments (message parts)."""
    problems = []
    if not params:
        problems.append("params is empty: pass the trainable parameters")
    if any(not p.requires_grad for p in params):
        problems.append("every tensor in params must require grad")
    if len({id(p) for p in params}) != len(params):
        problems.append("params lists the same tensor twice")
    if objective_given and (estimator is not None or eps is not None):
        problems.append("pass either objective= or the estimator=/eps= shorthands, not both")
    if eps is not None and not (eps >= 0 and math.isfinite(eps)):
        problems.append(f"eps must be a finite number >= 0, got {eps}")
    return problems


def check_unchanged(params: Sequence[torch.Tensor], versions: Sequence[int]) -> None:
    """Raise :class:`PolicyChangedError` if a parameter was written in place since ``versions``."""
    moved = [i for i, (p, v) in enumerate(zip(params, versions)) if p._version != v]
    if moved:
        raise PolicyChangedError(
            f"{len(moved)} parameter(s) (indices {moved[:8]}) were modified in place during the step; "
            "the streamed gradients were taken at the old values, so stepping now would mix two "
            "policies. Do not change parameters between the first event and the barrier."
        )


def finite_reward(trajectory_id: Hashable, reward: float) -> float:
    try:
        value = float(reward)
    except (TypeError, ValueError):
        raise InvalidRewardError(
            f"reward of trajectory {trajectory_id!r} is not a number: {reward!r}"
        ) from None
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
            f"tokens' log-probabilities), got {type(logprob).__name__} of shape "
            f"{getattr(logprob, 'shape', None)}"
        )


def finite_score(trajectory_id: Hashable, logprob: torch.Tensor) -> float:
    check_scalar(trajectory_id, logprob)
    check_graph(trajectory_id, logprob)
    value = float(logprob.detach())
    if not math.isfinite(value):
        raise InvalidLogprobError(f"logprob of trajectory {trajectory_id!r} is {value}; it must be finite")
    return value
