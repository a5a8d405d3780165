"""What every monitor shares: reading the step's statistics, reducing them across ranks, logging.

Every monitor reads ``trainer.strategy.last_step_stats`` (a :class:`StepStats`, set at the barrier
before ``on_train_batch_end``) and nothing private of the Trainer. Per-rank numbers are reduced
across ranks with torchmetrics (``compute()`` all-gathers the metric states when
``torch.distributed`` is initialised), so the logged value describes the whole step, whichever
rank's logger writes it. Every rank must therefore call :meth:`StepReducer.compute` at every step
that produced statistics; the strategy guarantees this by setting ``last_step_stats`` on all ranks.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torchmetrics import MaxMetric, MeanMetric, Metric, SumMetric
from typing_extensions import override

from thundersync_lightning.strategy.stats import StepStats

__all__ = ["StepStatsCallback", "StepStatsReader", "StepReducer", "Mean", "Sum", "Max", "log_step_metrics"]

log = logging.getLogger(__name__)
_warned: set[str] = set()


class StepStatsReader:
    """Hands each monitor every step's :class:`StepStats` exactly once.

    Returns ``None`` when the trainer's strategy records no statistics (any strategy other than
    ``"thundersync"``; warned once) or when ``last_step_stats`` is still the object already read
    (a batch end with no new barrier), so that no step is logged twice.
    """

    def __init__(self, who: str) -> None:
        self.who = who
        self._seen: StepStats | None = None

    def __call__(self, trainer: pl.Trainer) -> StepStats | None:
        strategy = trainer.strategy
        if not hasattr(strategy, "last_step_stats"):
            if self.who not in _warned:
                _warned.add(self.who)
                log.warning(
                    "%s: strategy %s has no `last_step_stats`; nothing is logged. Use "
                    'Trainer(strategy="thundersync") to get per-step rollout statistics.',
                    self.who,
                    type(strategy).__name__,
                )
            return None
        stats = strategy.last_step_stats
        if not isinstance(stats, StepStats) or stats is self._seen:
            return None
        self._seen = stats
        return stats


class Mean(NamedTuple):
    """A per-rank contribution to a mean: ``values`` (one or many), each weighted by ``weight``
    (default 1); reduced over ranks as the weighted mean of every rank's values."""

    values: float | Iterable[float]
    weight: float | None = None


class Sum(NamedTuple):
    """A per-rank contribution to a sum over ranks (an empty list counts 0)."""

    values: float | Iterable[float]


class Max(NamedTuple):
    """A per-rank contribution to a maximum over ranks (an empty list counts 0)."""

    values: float | Iterable[float]


Reduction = Mean | Sum | Max
_KIND = {Mean: "mean", Sum: "sum", Max: "max"}


class StepStatsCallback(Callback):
    """A monitor: what it measures in each step's :class:`StepStats`, and how that reduces over ranks.

    A metric is one method. :meth:`measure` returns this rank's contributions, each wrapped in
    how it reduces over ranks (:class:`Mean`, :class:`Sum`, :class:`Max`)::

        class RewardMax(StepStatsCallback):
            def measure(self, stats):
                return {
                    "rollout/reward_max": Max([t.reward for t in stats.trajectories if t.reward is not None])
                }

    Everything else is here: the Lightning hook, one torchmetrics reducer per monitor (built at the
    first step, on the module's device), the collective reduction on every rank, logging through
    ``pl_module.log`` and :attr:`last_metrics`. Names without a ``/`` are intermediates: they are
    reduced but not logged, and :meth:`derive` turns them into logged values (e.g. a ratio of two
    sums over ranks). :meth:`after_metrics` is for what a monitor does with the reduced values
    (raise, warn, write a file). :meth:`measure` must return the same names at every step on every
    rank (the reduction is a collective). Subclasses that define ``__init__`` call
    ``super().__init__()``.
    """

    log_metrics: bool = True
    """False: the reduced values are only kept (:attr:`last_metrics`), not logged."""

    def __init__(self) -> None:
        super().__init__()
        self._read_stats = StepStatsReader(type(self).__name__)
        self._reducer: StepReducer | None = None
        self._last: dict[str, float] = {}

    def measure(self, stats: StepStats) -> Mapping[str, Reduction]:
        """This rank's contributions to the step's metrics, by name."""
        raise NotImplementedError

    def derive(self, reduced: dict[str, float], stats: StepStats) -> dict[str, float]:
        """The logged values from the reduced ones (identical on every rank); by default every
        namespaced name as it was reduced."""
        return {k: v for k, v in reduced.items() if "/" in k}

    def after_metrics(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, stats: StepStats, metrics: dict[str, float]
    ) -> None:
        """Called on every rank after the step's metrics were reduced and logged."""

    @property
    def last_metrics(self) -> dict[str, float]:
        """The values logged at the last step."""
        return dict(self._last)

    @override
    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        stats = self._read_stats(trainer)
        if stats is not None:
            self.on_step_stats(trainer, pl_module, stats)

    def on_step_stats(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stats: StepStats) -> None:
        """Measure, reduce over ranks, derive, log; called once per step with statistics, on every rank."""
        measured = self.measure(stats)
        reducer = self._reducer_for(measured, pl_module.device)
        for name, value in measured.items():
            reducer.update(name, value.values, value.weight if isinstance(value, Mean) else None)
        self._last = self.derive(reducer.compute(), stats)
        if self.log_metrics:
            log_step_metrics(pl_module, self._last)
        self.after_metrics(trainer, pl_module, stats, self._last)

    def _reducer_for(self, measured: Mapping[str, Reduction], device: torch.device) -> StepReducer:
        kinds = {name: _KIND[type(value)] for name, value in measured.items()}
        if self._reducer is None:
            self._reducer = StepReducer(kinds).to(device)
        elif self._reducer.kinds != kinds:
            raise ValueError(
                f"{type(self).__name__}.measure returned {sorted(kinds)}, not the names and reductions of "
                f"the first step {sorted(self._reducer.kinds)}: every step on every rank must return the "
                "same ones (the reduction over ranks is a collective)"
            )
        return self._reducer


class StepReducer(torch.nn.Module):
    """Named torchmetrics aggregators, reduced across ranks and reset once per step.

    ``kinds`` maps each metric name to ``"mean"`` (weighted), ``"sum"`` or ``"max"``. Call
    :meth:`update` any number of times per step (every name at least once on every rank, with
    ``weight=0`` for an empty mean), then :meth:`compute` on every rank.
    """

    _KINDS: Mapping[str, type[Metric]] = {"mean": MeanMetric, "sum": SumMetric, "max": MaxMetric}

    def __init__(self, kinds: Mapping[str, str]) -> None:
        super().__init__()
        unknown = {k: v for k, v in kinds.items() if v not in self._KINDS}
        if unknown:
            raise ValueError(f"unknown reductions {unknown}; valid: {sorted(self._KINDS)}")
        # nan_strategy "ignore": an empty mean (weight 0) stays empty instead of warning
        self.metrics = torch.nn.ModuleDict(
            {
                _safe(name): self._KINDS[kind](nan_strategy="ignore").set_dtype(torch.float64)
                for name, kind in kinds.items()
            }
        )
        self._names = {_safe(name): name for name in kinds}
        self.kinds = dict(kinds)

    @property
    def names(self) -> list[str]:
        return list(self._names.values())

    def update(self, name: str, value: float | Iterable[float], weight: float | None = None) -> None:
        metric = self.metrics[_safe(name)]
        device = metric.device
        raw = list(value) if isinstance(value, Iterable) else value
        values = torch.as_tensor(raw, dtype=torch.float64, device=device)
        if isinstance(metric, MeanMetric):
            w = torch.as_tensor(1.0 if weight is None else weight, dtype=torch.float64, device=device)
            metric.update(values, w)
        elif values.numel() == 0:  # 0 is the identity of sums and of maxima of counts and bytes
            metric.update(torch.zeros((), dtype=torch.float64, device=device))
        else:
            metric.update(values)

    def compute(self) -> dict[str, float]:
        """Reduce every metric across ranks (a collective: call on every rank), then reset them."""
        out: dict[str, float] = {}
        for safe, metric in self.metrics.items():
            value = float(metric.compute())
            out[self._names[safe]] = value
            metric.reset()
        return out


def _safe(name: str) -> str:
    return name.replace("/", "__").replace(".", "_")


def log_step_metrics(pl_module: pl.LightningModule, metrics: Mapping[str, Any]) -> None:
    """Log already-reduced per-step values through ``pl_module.log`` (any Lightning logger);
    NaN (an empty mean) is left out rather than logged. Values go as float64 CPU tensors: Lightning
    would store plain floats in float32, which rounds byte counts and small ratios."""
    for key, value in metrics.items():
        if isinstance(value, float) and math.isnan(value):
            continue
        tensor = torch.tensor(float(value), dtype=torch.float64)
        pl_module.log(key, tensor, on_step=True, on_epoch=False, batch_size=1, sync_dist=False)
