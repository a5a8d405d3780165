"""What the strategy keeps for its learner across a fit's steps: one streaming accumulator, whose
gradient buffers are reused step after step, with its backward backend
(:mod:`~thundersync_lightning.core.gradients.backward`), both rebuilt only when the trainable parameters
(or the objective) change; and the recent calls' cost line, which sets
``min_batch_trajectories="auto"`` (:mod:`~thundersync_lightning.strategy.call_cost`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from torch import Tensor

from ..core.accumulator.bounds import AccumulatorBounds
from ..core.accumulator.streaming import StreamingGRPO
from ..core.gradients.backward import BackwardBackend
from ..core.gradients.storage import Offload
from ..core.grpo.objective import Objective
from .call_cost import CallCost
from .stats import Interval

__all__ = ["FitLearner"]


def _same(a: Sequence[Tensor], b: Sequence[Tensor]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class FitLearner:
    def __init__(self) -> None:
        self._accumulator: StreamingGRPO | None = None
        self._cost = CallCost()

    def accumulator(
        self,
        params: Sequence[Tensor],
        objective: Objective,
        offload: Offload,
        bounds: AccumulatorBounds,
        backend: Callable[[Sequence[Tensor]], BackwardBackend],
        filter_groups: bool = False,
    ) -> StreamingGRPO:
        """The step's accumulator: the fit's one, reset, unless the parameters, objective or group
        filter (dynamic sampling) changed (then a new one, with ``backend(params)`` as its backward
        backend)."""
        acc = self._accumulator
        stale = acc is None or acc.objective != objective or acc.filter_groups != filter_groups
        if stale or not _same(acc.params, params):
            acc = self._accumulator = StreamingGRPO(
                params,
                objective=objective,
                offload=offload,
                bounds=bounds,
                backend=backend(params),
                filter_groups=filter_groups,
            )
        else:
            acc.reset()
        return acc

    def min_batch(self, setting: int | str, mode: str, max_rows: int) -> int:
        """The rows a call of this step waits for: ``setting``, resolved when ``"auto"`` (1 in sync,
        whose learner starts after the last event anyway)."""
        if mode == "sync":
            return 1
        return self._cost.min_rows(max_rows) if setting == "auto" else int(setting)

    def after_step(self, busy: Iterable[Interval] = ()) -> None:
        """The step's learner calls join the cost line."""
        self._cost.observe((i.trajectories, i.seconds) for i in busy if i.kind == "backward")

    def clear(self) -> None:
        self._accumulator = None
        self._cost = CallCost()  # a later fit may train another model: its calls start a new line
