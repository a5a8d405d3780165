"""The step's counts that set the objective's normaliser D and batch scale s (summed over ranks)."""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

__all__ = ["BatchTotals"]


@dataclass(frozen=True, slots=True)
class BatchTotals:
    """Counts of one step that set the normaliser D and the batch scale (sum over ranks).

    ``reward_*`` are moments of the kept rewards (for ``scale="batch"``), ``is_weight_*`` the sum and
    count of their importance weights (for ``is_batch_normalize``).
    """

    groups: float = 0.0
    sequences: float = 0.0
    tokens: float = 0.0
    reward_count: float = 0.0
    reward_sum: float = 0.0
    reward_sq_sum: float = 0.0
    is_weight_sum: float = 0.0  # importance weights of kept trajectories (``is_batch_normalize``)
    is_weight_count: float = 0.0

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor([getattr(self, f.name) for f in fields(self)], dtype=torch.float64)

    @staticmethod
    def from_tensor(t: torch.Tensor) -> BatchTotals:
        return BatchTotals(*(float(v) for v in t.tolist()))

    def __add__(self, other: BatchTotals) -> BatchTotals:
        return BatchTotals(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))
