"""The barrier's bookkeeping: what a step accumulates, the counts summed over ranks, its statistics.

At the barrier every rank's accumulator has folded its own groups. The objective's normaliser D
and the batch reward scale s are global, so the step's counts (:class:`BatchTotals`), the
on-policy statistics and the two objective parts are summed over ranks (one SUM all-reduce and
one MAX for the largest logprob difference) before :meth:`StreamingGRPO.finish` applies them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..core.accumulator.streaming import StreamingGRPO, StreamingReport
from ..core.batches import RolloutBatch
from ..core.gradients.storage import ByteUsage
from ..core.grpo.objective import BatchTotals
from ..core.grpo.terms import OnPolicyStats
from ..core.types import RolloutRequest
from .records import StepOutcome
from .stats import Interval, StepStats

__all__ = ["StepInFlight", "global_totals"]


@dataclass
class StepInFlight:
    """What one step accumulates between its rollout and its optimizer step."""

    start: float
    plan: RolloutBatch
    request: RolloutRequest
    outcome: StepOutcome
    busy: list[Interval]
    issued_at: float
    report: StreamingReport | None = None
    loss: float = 0.0
    num_groups: int = 0
    on_policy: OnPolicyStats = OnPolicyStats()

    def stats(self, mode: str, version: int, rank: int, world_size: int) -> StepStats:
        """The step's :class:`StepStats` once version ``version`` has been trained on it."""
        report, outcome, on_policy = self.report, self.outcome, self.on_policy
        return StepStats(
            step=self.request.step,
            mode=mode,
            policy_version=version,
            rank=rank,
            world_size=world_size,
            step_start=self.start,
            step_end=time.monotonic(),
            trajectories=outcome.records(version),
            busy=tuple(sorted(self.busy + outcome.busy, key=lambda i: i.start)),
            open_groups=tuple(outcome.open_groups),
            accumulator=report.peak_bytes if report is not None else ByteUsage(),
            groups_folded=report.groups_folded if report is not None else len(self.request.groups),
            groups_aborted=report.groups_aborted if report is not None else 0,
            peak_held_trajectories=report.peak_held_trajectories if report is not None else 0,
            peak_held_bytes=report.peak_held_bytes if report is not None else 0,
            num_groups_global=self.num_groups,
            learner_tokens=outcome.learner_tokens,
            backward_passes=report.backward_passes if report is not None else 0,
            loss=self.loss,
            logprob_diff_mean=on_policy.abs_diff_mean if on_policy.tokens else None,
            logprob_diff_max=on_policy.abs_diff_max if on_policy.tokens else None,
            engine_learner_kl=on_policy.kl if on_policy.tokens else None,
            rollout_issued_at=self.issued_at,
            min_batch_trajectories=outcome.min_batch_trajectories,
            max_batch_trajectories=outcome.max_batch_trajectories,
            hold_after_s=outcome.hold_after_s,
            groups_generated=outcome.groups_generated,
            groups_filtered=outcome.groups_filtered,
        )


def global_totals(
    acc: StreamingGRPO, world_size: int, device: torch.device
) -> tuple[BatchTotals, OnPolicyStats, tuple[float, float]]:
    """The step's counts, on-policy statistics and objective parts summed over ranks (two collectives)."""
    totals, stats = acc.totals(), acc.on_policy
    parts = acc.objective_parts()
    if world_size <= 1 or not dist.is_initialized():
        return totals, stats, parts
    extra = [float(stats.tokens), stats.abs_diff_sum, stats.kl_sum, *parts]
    t = torch.cat([totals.as_tensor(), torch.tensor(extra, dtype=torch.float64)]).to(device)
    dist.all_reduce(t)
    peak = torch.tensor([stats.abs_diff_max], dtype=torch.float64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    values = t.cpu()
    k = len(BatchTotals.__dataclass_fields__)
    tokens, abs_sum, kl_sum, obj, ind = values[k:].tolist()
    return (
        BatchTotals.from_tensor(values[:k]),
        OnPolicyStats(int(tokens), abs_sum, float(peak.item()), kl_sum),
        (obj, ind),
    )
