"""MFUMonitor: model FLOPs utilisation of the learner, over the whole step and over busy time.

Per step, with ``F_r`` the model FLOPs of rank r's work (:mod:`.flops`), ``W_r`` its step wall
seconds, ``B_r`` its busy seconds, ``P`` the peak FLOP/s of one device and ``D`` the world size::

    perf/mfu      = sum_r F_r / (max_r W_r * P * D)   # what the paper reports: idle time counts
    perf/mfu_busy = sum_r F_r / (sum_r B_r * P)       # FLOPs per busy device-second

The peak and its source are logged once as hyperparameters (``perf/peak_flops_per_second``,
``perf/peak_flops_source``, ``perf/flops_count``) to every logger.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.utilities import rank_zero_only
from typing_extensions import override

from thundersync_lightning.callbacks.base import Max, Reduction, StepStatsCallback, Sum
from thundersync_lightning.callbacks.flops import (
    MeasuredFlops,
    PeakFlops,
    TransformerShape,
    analytic_step_flops,
    precision_to_dtype,
    resolve_peak_flops,
    transformer_shape,
)
from thundersync_lightning.strategy.stats import StepStats

__all__ = ["MFUMonitor"]

log = logging.getLogger(__name__)

METRIC_KEYS = (
    "perf/mfu",
    "perf/mfu_busy",
    "perf/model_flops_per_step",
    "perf/model_flops_per_second",
    "perf/learner_tokens_per_second",
)


class MFUMonitor(StepStatsCallback):
    """Log ``perf/mfu``, ``perf/mfu_busy``, ``perf/model_flops_per_step``,
    ``perf/model_flops_per_second`` and ``perf/learner_tokens_per_second`` at every step.

    Args:
        peak_flops: dense peak FLOP/s of one device; ``None`` resolves it (see :mod:`.flops`).
        flops: ``"analytic"`` (PaLM's count from the model's shape) or ``"measured"``
            (Lightning's ``measure_flops`` on a meta copy).
        calibrate_cpu: on CPU, with no explicit peak, time a matmul to find one; otherwise MFU is
            not logged on CPU.
        clock: the clock the calibration times with (tests pass a fake one).
    """

    def __init__(
        self,
        peak_flops: float | None = None,
        flops: Literal["analytic", "measured"] = "analytic",
        calibrate_cpu: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if flops not in ("analytic", "measured"):
            raise ValueError(f'flops must be "analytic" or "measured", got {flops!r}')
        self._explicit_peak = peak_flops
        self.flops = flops
        self.calibrate_cpu = calibrate_cpu
        self._clock = clock
        self._peak: PeakFlops | None = None
        self._shape: TransformerShape | None = None
        self._measured: MeasuredFlops | None = None
        super().__init__()

    @property
    def peak(self) -> PeakFlops | None:
        """The resolved peak FLOP/s of one device and its source (after ``setup``)."""
        return self._peak

    @property
    def metric_keys(self) -> list[str]:
        """Every key this monitor logs (the MFU keys only when a peak is known)."""
        return [*METRIC_KEYS]

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        dtype = precision_to_dtype(str(trainer.precision))
        peak = resolve_peak_flops(
            pl_module.device, dtype, self._explicit_peak, self.calibrate_cpu, self._clock
        )
        self._peak = trainer.strategy.broadcast(peak)  # one peak for all ranks (calibration varies)
        model = getattr(pl_module, "model", pl_module)
        if self.flops == "analytic":
            self._shape = transformer_shape(model)
        else:
            self._measured = MeasuredFlops(model)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._log_peak(trainer)

    @rank_zero_only
    def _log_peak(self, trainer: pl.Trainer) -> None:
        peak = self._peak
        if peak is None:
            return
        params: dict[str, Any] = {
            "perf/peak_flops_per_second": peak.flops_per_second,
            "perf/peak_flops_source": peak.source,
            "perf/peak_flops_device": peak.device_name,
            "perf/flops_count": self.flops,
        }
        log.info(
            "MFU peak: %s FLOP/s per device (%s, %s)", peak.flops_per_second, peak.source, peak.device_name
        )
        for logger in trainer.loggers:
            logger.log_hyperparams(params)

    def step_flops(self, stats: StepStats) -> int:
        """Model FLOPs of this rank's learner work in the step described by ``stats``."""
        lengths = [t.num_tokens for t in stats.trajectories]
        if self._measured is not None:
            return self._measured.step_flops(lengths)
        if self._shape is None:
            raise RuntimeError("MFUMonitor.setup has not run")
        return analytic_step_flops(self._shape, stats.learner_tokens, lengths)

    @override
    def measure(self, stats: StepStats) -> dict[str, Reduction]:
        return {
            "flops": Sum(float(self.step_flops(stats))),
            "tokens": Sum(float(stats.learner_tokens)),
            "wall": Max(stats.wall_seconds),
            "busy": Sum(stats.busy_seconds),
        }

    @override
    def derive(self, reduced: dict[str, float], stats: StepStats) -> dict[str, float]:
        return self.metrics(reduced, stats.world_size)

    def metrics(self, total: dict[str, float], world_size: int) -> dict[str, float]:
        """The logged values from the rank-reduced sums (see the module docstring)."""
        flops, wall, busy = total["flops"], total["wall"], total["busy"]
        out = {
            "perf/model_flops_per_step": flops,
            "perf/model_flops_per_second": flops / wall if wall > 0 else 0.0,
            "perf/learner_tokens_per_second": total["tokens"] / wall if wall > 0 else 0.0,
        }
        peak = self._peak.flops_per_second if self._peak is not None else None
        if peak:
            out["perf/mfu"] = flops / (wall * peak * world_size) if wall > 0 else 0.0
            out["perf/mfu_busy"] = flops / (busy * peak) if busy > 0 else 0.0
        return out
