"""What the strategy keeps for its learner across a fit's steps: one streaming accumulator, whose
gradient buffers are reused step after step, and the split-backward capture
(:mod:`~thundersync_lightning.strategy.split_choice`), both rebuilt only when the trainable
parameters (or the objective) change; and the recent calls' cost line, which sets
``min_batch_trajectories="auto"`` (:mod:`~thundersync_lightning.strategy.call_cost`)."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

from torch import Tensor

from ..core.objective import Objective
from ..core.split_backward import RowCapture
from ..core.storage import Offload
from ..core.streaming import StreamingGRPO
from .call_cost import CallCost
from .split_choice import SplitBackward, row_capture
from .stats import Interval

__all__ = ["FitLearner"]

log = logging.getLogger(__name__)


def _same(a: Sequence[Tensor], b: Sequence[Tensor]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class FitLearner:
    def __init__(self) -> None:
        self._accumulator: StreamingGRPO | None = None
        self._split: tuple[tuple[Tensor, ...], RowCapture | None] | None = None  # (params, capture)
        self._cost = CallCost()

    def accumulator(
        self,
        params: Sequence[Tensor],
        objective: Objective,
        offload: Offload,
        max_open_groups: int | None,
        max_held_trajectories: int | None,
        filter_groups: bool = False,
    ) -> StreamingGRPO:
        """The step's accumulator: the fit's one, reset, unless the parameters, objective or group
        filter (dynamic sampling) changed."""
        acc = self._accumulator
        stale = acc is None or acc.objective != objective or acc.filter_groups != filter_groups
        if stale or not _same(acc.params, params):
            acc = self._accumulator = StreamingGRPO(
                params,
                objective=objective,
                offload=offload,
                max_open_groups=max_open_groups,
                max_held_trajectories=max_held_trajectories,
                filter_groups=filter_groups,
            )
        else:
            acc.reset()
        return acc

    def capture(
        self, setting: SplitBackward, module: Any, params: Sequence[Tensor], mode: str, boundary_cut: bool, sharding: str
    ) -> RowCapture | None:
        """The fit's split-backward capture, or None (built once per set of trainable parameters)."""
        if self._split is None or not _same(self._split[0], params):
            self._split = (tuple(params), row_capture(setting, module, params, mode, boundary_cut, sharding))
        return self._split[1]

    def min_batch(self, setting: int | str, mode: str, max_rows: int) -> int:
        """The rows a call of this step waits for: ``setting``, resolved when ``"auto"`` (1 in sync,
        whose learner starts after the last event anyway)."""
        if mode == "sync":
            return 1
        return self._cost.min_rows(max_rows) if setting == "auto" else int(setting)

    def after_step(self, busy: Iterable[Interval] = ()) -> None:
        """The step's learner calls join the cost line. A lenient capture that refused the model is
        dropped for the rest of the fit, with a warning."""
        self._cost.observe((i.trajectories, i.seconds) for i in busy if i.kind == "backward")
        if self._split is not None and self._split[1] is not None and self._split[1].refused is not None:
            log.warning("split_backward='auto' turned off for this fit: %s", self._split[1].refused)
            self._split = (self._split[0], None)

    def clear(self) -> None:
        self._accumulator = None
        self._split = None
        self._cost = CallCost()  # a later fit may train another model: its calls start a new line
