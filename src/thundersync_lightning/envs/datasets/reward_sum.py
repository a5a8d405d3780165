"""Several rewards with weights, as TRL's ``reward_funcs`` / ``reward_weights``.

    reward: [my_rewards:correct, {name: regex_match, pattern: "</think>"}]
    reward_weights: [1.0, 0.2]            # default: 1 each

The trajectory's reward is ``R = sum_i w_i r_i``; each ``r_i`` (unweighted) travels with it in a
:class:`~thundersync_lightning.core.types.WeightedReward` and is logged as
``rollout/reward/{name}_mean`` (``name``: the registered name or the function's, ``_2``, ``_3``
for repeats). A reward that raises or is not a finite number fails the trajectory (reward 0,
``RewardError`` naming it), as with one reward: a partial sum would be a reward nobody asked for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.errors import ConfigError
from ...core.types import WeightedReward
from ..tools.confine import WorkerLimits
from .rewards import RewardFn, call_reward, check_reward_signature, resolve_reward

__all__ = ["RewardSum"]

RewardSpec = str | Mapping[str, Any] | RewardFn


class RewardSum:
    """``specs`` (one spec or a list) with ``weights`` (None: 1 each); ConfigError lists every problem.
    ``limits`` confine the workers of the rewards that run in one (None: the defaults)."""

    def __init__(self, specs: RewardSpec | Sequence[RewardSpec], weights: Sequence[float] | None = None,
                 limits: WorkerLimits | None = None) -> None:
        self.limits = limits
        listed = list(specs) if isinstance(specs, Sequence) and not isinstance(specs, str) else [specs]
        problems: list[str] = []
        if not listed:
            problems.append("reward: give at least one reward")
        self.rewards = []
        for spec in listed:
            try:
                self.rewards.append(resolve_reward(spec))
            except ConfigError as exc:
                problems.append(str(exc))
        self.weights = [1.0] * len(listed) if weights is None else [float(w) for w in weights]
        if len(self.weights) != len(listed):
            problems.append(f"reward_weights has {len(self.weights)} values for {len(listed)} rewards")
        if not all(math.isfinite(w) for w in self.weights):
            problems.append(f"reward_weights must be finite numbers, got {list(weights or [])}")
        if problems:
            raise ConfigError("; ".join(problems))
        names: list[str] = []
        for fn in self.rewards:
            base = fn.name.rpartition(":")[2].rpartition(".")[2] or "reward"
            name, k = base, 1
            while name in names:
                k += 1
                name = f"{base}_{k}"
            names.append(name)
        self.names = tuple(names)

    def signature_problems(self, fields: Sequence[str]) -> list[str]:
        """Each reward that cannot be called with the mapped ``fields`` (see ``check_reward_signature``)."""
        return [p for p in (check_reward_signature(fn, fields) for fn in self.rewards) if p]

    def __call__(self, prompt: Any, completion: str, row: Mapping[str, Any]) -> WeightedReward:
        """``sum_i w_i r_i`` with its parts; RewardError when any reward fails."""
        parts = [(name, call_reward(fn, prompt, completion, row, limits=self.limits))
                 for name, fn in zip(self.names, self.rewards)]
        return WeightedReward.combine(parts, self.weights)
