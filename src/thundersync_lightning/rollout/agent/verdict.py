"""A verdict's value as the learner receives it: a finite reward (or 0 and why), its named parts,
and whether every reward declined it (unscorable)."""

from __future__ import annotations

import math
import numbers
from typing import Any, NamedTuple

from ...core.types import WeightedReward

__all__ = ["check_verdict", "reward_parts", "Verdict", "read_verdict"]


class Verdict(NamedTuple):
    """What :class:`~thundersync_lightning.core.types.RewardReady` carries of a verdict's value."""

    reward: float
    failure: str | None
    parts: tuple[tuple[str, float], ...]
    unscorable: bool


def read_verdict(value: Any) -> Verdict:
    """A :class:`~thundersync_lightning.core.types.WeightedReward` says its own failure, parts
    (kept with a failure: the rewards that gave a value) and unscorability; any other value is
    read by :func:`check_verdict`."""
    if isinstance(value, WeightedReward) and value.failure is not None:
        return Verdict(0.0, value.failure, value.parts, False)
    reward, failure = check_verdict(value)
    if failure is not None:
        return Verdict(0.0, failure, (), False)
    unscorable = isinstance(value, WeightedReward) and value.unscorable
    return Verdict(0.0 if unscorable else reward, None, reward_parts(value), unscorable)


def check_verdict(value: Any) -> tuple[float, str | None]:
    """(reward, failure): a finite real number passes; anything else is reward 0.0 with the reason.

    Real numbers include ``bool`` (pass/fail as 1.0/0.0) and numpy scalars; reasons read
    "verdict returned nan", "verdict returned -inf", "verdict returned str 'PASSED', not a real
    number".
    """
    if isinstance(value, numbers.Real):
        try:
            reward = float(value)
        except (TypeError, ValueError, OverflowError) as exc:
            return (
                0.0,
                f"verdict returned {type(value).__name__} {_short(value)}, not convertible to float ({exc})",
            )
        if math.isfinite(reward):
            return reward, None
        return 0.0, f"verdict returned {reward!r}"
    return 0.0, f"verdict returned {type(value).__name__} {_short(value)}, not a real number"


def reward_parts(value: Any) -> tuple[tuple[str, float], ...]:
    """The named rewards of a :class:`~thundersync_lightning.core.types.WeightedReward` verdict (else
    none)."""
    return value.parts if isinstance(value, WeightedReward) else ()


def _short(value: Any, limit: int = 120) -> str:
    try:
        text = repr(value)
    except Exception as exc:  # a hostile __repr__ must not take the loop down
        text = f"<unrepresentable: {type(exc).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."
