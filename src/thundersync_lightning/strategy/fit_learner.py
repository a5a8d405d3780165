"""What the strategy keeps for its learner across a fit's steps: one streaming accumulator, whose
gradient buffers are reused step after step, with its backward backend
(:mod:`~thundersync_lightning.core.gradients.backward`), both rebuilt only when the trainable parameters
(or the objective) change; the recent calls' cost line, which sets
``min_batch_trajectories="auto"`` (:mod:`~thundersync_lightning.strategy.call_cost`); and the recent
verdicts' lags behind their content, which set ``hold_after_s="auto"``:

    hold_after = L if L <= C else 0

with L the 90th percentile of the last steps' lags (content to reward, as the learner saw them) and
C the mean seconds of the last steps' learner calls. A row of a group still waiting for rewards
costs more than one whose group's rewards are known (held: a gradient of its own and a fold, one
backward each without the split backward; into the group's sums: the sums and their fold): where
verdicts usually land within a call's time of their content (fast rewards), the learner waits up to
L for them instead, which cannot end its work later than the partial-group call would have; where
they lag by more than a call (tests of an agentic episode), it holds at once, as streaming is for.
The gradient does not depend on it."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from torch import Tensor

from ..core.accumulator.bounds import AccumulatorBounds
from ..core.accumulator.streaming import StreamingGRPO
from ..core.gradients.backward import BackwardBackend
from ..core.gradients.storage import Offload
from ..core.grpo.objective import Objective
from .call_cost import CallCost
from .stats import Interval

__all__ = ["FitLearner", "LAG_WINDOW"]

#: Verdict lags and call seconds ``hold_after_s="auto"`` reads: about the last few steps'.
LAG_WINDOW = 256


def _same(a: Sequence[Tensor], b: Sequence[Tensor]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b))


class FitLearner:
    def __init__(self) -> None:
        self._accumulator: StreamingGRPO | None = None
        self._cost = CallCost()
        self._lags: deque[float] = deque(maxlen=LAG_WINDOW)
        self._call_seconds: deque[float] = deque(maxlen=LAG_WINDOW)

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

    def hold_after(self, setting: float | str, mode: str) -> float:
        """Seconds a reward-pending row's content waits before the learner holds it: ``setting``,
        resolved when ``"auto"`` (module docstring; 0 before any verdict or call was seen, and in sync,
        whose learner starts after the last event)."""
        if mode == "sync":
            return 0.0
        if setting != "auto":
            return float(setting)
        if not self._lags or not self._call_seconds:
            return 0.0
        lags = sorted(self._lags)
        lag = lags[min(len(lags) - 1, math.ceil(0.9 * len(lags)) - 1)]
        return lag if lag <= sum(self._call_seconds) / len(self._call_seconds) else 0.0

    def after_step(self, busy: Iterable[Interval] = (), reward_lags: Iterable[float] = ()) -> None:
        """The step's learner calls join the cost line, its verdicts' lags the lag window."""
        calls = [(i.trajectories, i.seconds) for i in busy if i.kind == "backward"]
        self._cost.observe(calls)
        self._call_seconds.extend(s for _, s in calls)
        self._lags.extend(reward_lags)

    def clear(self) -> None:
        self._accumulator = None
        self._cost = CallCost()  # a later fit may train another model: its calls start a new line
        self._lags.clear()
        self._call_seconds.clear()
