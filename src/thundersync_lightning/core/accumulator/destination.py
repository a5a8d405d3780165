"""Where one backward job's gradient goes: a small typed value instead of a ``(kind, key)`` pair.

====================  =====================================  =========================================
kind                  fields                                 gradient goes to
====================  =====================================  =========================================
``direct``            -                                      the step's scaled gradient
``regulariser_now``   -                                      the step's gradient of regulariser terms R_i
``sum``               ``group``, ``reward`` (``flagged``)    that group's sum for that reward value
                                                             (``None``: its floored failures' sum F)
                                                             (``flagged``: of its ``off_policy_mask``
                                                             members, folded with max(A, 0))
``regulariser_sum``   ``group``                              that group's R sum (dynamic sampling)
``held``              ``trajectory``                         held apart until the reward lands
``regulariser_held``  ``trajectory``                         grad R_i held apart until the verdict
====================  =====================================  =========================================
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

__all__ = ["Destination", "DestinationKind", "STEP", "STEP_REGULARISER"]

DestinationKind = Literal["direct", "regulariser_now", "sum", "regulariser_sum", "held", "regulariser_held"]


@dataclass(frozen=True, slots=True)
class Destination:
    """One destination (module docstring); only the fields its ``kind`` needs are set."""

    kind: DestinationKind
    group: Hashable | None = None
    trajectory: Hashable | None = None
    reward: float | None = None
    flagged: bool = False

    @classmethod
    def group_sum(cls, group: Hashable, reward: float | None, flagged: bool = False) -> Destination:
        """The group's sum of ``reward`` (None: of its floored failures, folded at f_g)."""
        return cls("sum", group=group, reward=reward, flagged=flagged)

    @classmethod
    def group_regulariser(cls, group: Hashable) -> Destination:
        return cls("regulariser_sum", group=group)

    @classmethod
    def held(cls, trajectory: Hashable, regulariser: bool = False) -> Destination:
        return cls("regulariser_held" if regulariser else "held", trajectory=trajectory)

    @property
    def to_step(self) -> bool:
        """The step's gradient takes it now (no group, nothing held)."""
        return self.kind in ("direct", "regulariser_now")

    @property
    def deferrable(self) -> bool:
        """Its coefficient is not known yet: a backend may keep the gradient in its own form."""
        return self.kind in ("sum", "held", "regulariser_held")

    def __str__(self) -> str:
        where = [
            f"{k}={v!r}"
            for k, v in (("group", self.group), ("trajectory", self.trajectory), ("reward", self.reward))
            if v is not None
        ]
        return f"{self.kind}({', '.join(where)}{', flagged' if self.flagged else ''})"


#: the step's scaled gradient, and its gradient of regulariser terms
STEP = Destination("direct")
STEP_REGULARISER = Destination("regulariser_now")
