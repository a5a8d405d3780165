"""How many rows a learner call should wait for: ``ThunderSyncStrategy(min_batch_trajectories="auto")``.

A call of n trajectories costs about ``a + b n`` seconds: a fixed part ``a`` (the launch of every
layer's kernels, the optimizer-free bookkeeping of one ``add_tokens``, a backend's forward watch) and a
part per row ``b``. Waiting until k rows are there instead of starting at once merges calls, each
merge saving one ``a``, and costs the step at most the work of the k - 1 rows that waited for
the last content, ``(k - 1) b``: with ``k = ceil(a / b)`` that is at most one call's fixed part.
So the rule is ``k = clamp(ceil(a / b), 1, max_batch_trajectories)``, with ``a`` and ``b`` the
least-squares line through the seconds of the last ``window`` calls (every call of the recent
steps, during generation and after it, so the cost of sharing the device with the engine is in
the fit). Compute-bound calls (``a`` small against ``b``: long trajectories, large models) give
k = 1, the learner starting at once; overhead-bound ones (tiny models, CPU) give k > 1.

Until two calls of different sizes have been seen, k = 1. The gradient does not depend on k.
The seconds are the host's clock around each call. On CUDA they include the device's work
because ``StreamingGRPO.add_tokens`` reads per-row values back to the host after the backward,
which waits for the stream; measured on CPU only so far.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable

__all__ = ["CallCost"]


class CallCost:
    """The least-squares line ``seconds = a + b * trajectories`` over the last ``window`` learner calls."""

    def __init__(self, window: int = 256) -> None:
        self._calls: deque[tuple[int, float]] = deque(maxlen=window)

    def observe(self, calls: Iterable[tuple[int, float]]) -> None:
        """Add calls as (trajectories, seconds)."""
        self._calls.extend((n, s) for n, s in calls if n > 0 and s >= 0.0)

    def line(self) -> tuple[float, float] | None:
        """(a, b): fixed seconds per call and seconds per row; None without two distinct sizes or
        with a line that does not rise (no cost per row to trade against)."""
        if len({n for n, _ in self._calls}) < 2:
            return None
        count = len(self._calls)
        mean_n = sum(n for n, _ in self._calls) / count
        mean_s = sum(s for _, s in self._calls) / count
        spread = sum((n - mean_n) ** 2 for n, _ in self._calls)
        b = sum((n - mean_n) * (s - mean_s) for n, s in self._calls) / spread
        if b <= 0.0:
            return None
        return max(0.0, mean_s - b * mean_n), b

    def min_rows(self, max_rows: int) -> int:
        """k = clamp(ceil(a / b), 1, max_rows); 1 while the line is unknown."""
        fit = self.line()
        if fit is None:
            return 1
        a, b = fit
        return max(1, min(max_rows, math.ceil(a / b)))
