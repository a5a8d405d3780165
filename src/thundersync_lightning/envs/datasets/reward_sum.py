"""Several rewards with weights, as TRL's ``reward_funcs`` / ``reward_weights``.

    reward: [my_rewards:correct, {name: regex_match, pattern: "</think>"}]
    reward_weights: [1.0, 0.2]            # default: 1 each

The trajectory's reward is TRL's ``nansum``: ``R = sum_{i: r_i is not None} w_i r_i``; a reward
that returns ``None`` declines the completion ("not applicable") and is left out. A completion
that every reward declines is unscorable (``WeightedReward.unscorable``: it leaves its group's
mean and std, its advantage is 0). Each given ``r_i`` (unweighted) travels with the trajectory in a
:class:`~thundersync_lightning.core.types.WeightedReward` and is logged as
``rollout/reward/{name}_mean`` (``name``: the registered name or the function's, ``_2``, ``_3``
for repeats), averaged over the trajectories where that reward gave a value. A reward that raises
or returns neither a finite number nor None fails the trajectory (reward 0, ``RewardError`` naming
it): a partial sum would be a reward nobody asked for. The other rewards still run, so their
means count the trajectory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ...core.errors import ConfigError
from ...core.types import WeightedReward
from ..tools.confine import WorkerLimits
from .rewards import RewardError, RewardFn, RewardInput, call_reward, check_reward_signature, resolve_reward

__all__ = ["RewardSum"]

RewardSpec = str | Mapping[str, Any] | RewardFn


class RewardSum:
    """``specs`` (one spec or a list) with ``weights`` (None: 1 each); ConfigError lists every problem.
    ``limits`` confine the workers of the rewards that run in one (None: the defaults)."""

    def __init__(
        self,
        specs: RewardSpec | Sequence[RewardSpec],
        weights: Sequence[float] | None = None,
        limits: WorkerLimits | None = None,
    ) -> None:
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

    def signature_problems(self, columns: Sequence[str], origin: str = "the data") -> list[str]:
        """Each reward that cannot be called with ``columns`` (see ``check_reward_signature``)."""
        return [p for fn in self.rewards for p in check_reward_signature(fn, columns, origin)]

    def score(self, inp: RewardInput) -> WeightedReward:
        """``sum_i w_i r_i`` over the rewards that gave a value, with those values; unscorable when
        every reward declined; 0.0 with the first failure (and the values given) when one failed."""
        parts: list[tuple[str, float | None]] = []
        failure = None
        for name, fn in zip(self.names, self.rewards):
            try:
                parts.append((name, call_reward(fn, inp, limits=self.limits)))
            except RewardError as exc:
                failure = failure or f"RewardError: {exc}"
                parts.append((name, None))
        return WeightedReward.combine(parts, self.weights, failure)

    def __call__(self, prompt: Any, completion: str, row: Mapping[str, Any]) -> WeightedReward:
        """:meth:`score` of a single-turn ``completion`` to ``prompt`` (``row``: the columns)."""
        return self.score(RewardInput(prompt, completion, dict(row)))
