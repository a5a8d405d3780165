"""The learner workloads of ``overlap.py`` (``--workload``) and the balance calibration.

``short``: the original benchmark: a 2.4M-parameter Qwen3 and the trace's own lengths (8-252
scored tokens + a 16-token prompt, ~70 tokens a trajectory), where one trajectory's backward is
dominated by per-call overheads.

``long``: what a coding agent's learner sees: a >= 20M-parameter Qwen3 (hidden 512, 4 layers,
vocab 8192: 20.2M parameters, 16.0M in matmuls) and trajectories of ~500-2000 tokens (a 448-token
prompt, the trace's scored tokens x 6 in two turns with a 4-token observation between), so one
trajectory's backward is compute-bound. Its ``--quick`` run keeps the model and the lengths and
cuts the batch (4 x 2), rounds and steps, so it fits in minutes on 2 cores; the balance calibration
keeps the synchronous learner's idle fraction at the paper's 49.5% for any batch.

``paper``: the paper's table at the largest shape one H100/H200 holds: a Qwen3-1.7B-shaped
learner (random weights, the published dimensions: 1.72B parameters) in bf16, full fine-tune with
AdamW, and coding-agent trajectories: a 1024-token prompt, then the trace's scored tokens x 16
(128-4032, mean 774) in 4 turns with a 128-token tool observation between turns (1.5k-5.4k tokens
a trajectory); 4 groups x 4 a step, calls of at most 4096 tokens (a longer trajectory goes
alone), one open group and one held gradient: the memory plan's device bound is then 47 GiB in
sync and 66 GiB in streaming (fp32 sums of 1.72B parameters are 6.9 GB each), under an H100's
80 GB. ``--model 0.6B`` runs the Qwen3-0.6B shape instead (27 / 34 GiB; what a shorter slot fits).

Balance calibration: with W the synchronous learner's measured work per step (seconds) and M_k the
trace makespan of step k in units, the time scale s solves

    mean_k  M_k s / (M_k s + W)  =  idle        (idle = 0.495, the paper's measurement)

(the left side increases with s; bisection). At 16 x 8 this is the ``sync`` calibration (W = B G
units), which the trace was built for.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

__all__ = ["Workload", "WORKLOADS", "balance_time_scale"]

PAPER_SYNC_IDLE = 0.495


@dataclass(frozen=True, slots=True)
class Workload:
    """Model and trajectory shape; ``quick_*`` replace the batch and schedule under ``--quick``."""

    hidden: int
    intermediate: int
    layers: int
    vocab: int
    prompt_tokens: int
    token_scale: float
    max_positions: int
    calibrate: Literal["sync", "balance"]
    quick_hidden: int | None = None
    quick_vocab: int | None = None
    quick_groups: int | None = None
    quick_group_size: int | None = None
    quick_rounds: int = 2
    quick_steps: int = 4
    quick_calibration_samples: int = 12
    quick_calibration_reps: int = 2
    model: str | None = None  # a published Qwen3 shape ("1.7B"): its dimensions replace the four above
    precision: str = "32-true"
    turns: int = 2
    observation_tokens: int = 4
    groups: int = 16
    group_size: int = 8
    max_batch_tokens: int | None = None
    max_open_groups: int | None = None
    max_held_trajectories: int | None = None


WORKLOADS = {
    "short": Workload(
        hidden=256, intermediate=1024, layers=2, vocab=1024, prompt_tokens=16, token_scale=1.0,
        max_positions=512, calibrate="sync", quick_hidden=128, quick_vocab=256,
    ),
    "long": Workload(
        hidden=512, intermediate=1536, layers=4, vocab=8192, prompt_tokens=448, token_scale=6.0,
        max_positions=2048, calibrate="balance", quick_groups=4, quick_group_size=2, quick_rounds=1,
        quick_steps=3, quick_calibration_samples=4, quick_calibration_reps=1,
    ),
    "paper": Workload(
        hidden=2048, intermediate=6144, layers=28, vocab=151936, prompt_tokens=1024, token_scale=16.0,
        max_positions=40960, calibrate="balance", model="1.7B", precision="bf16-true", turns=4,
        observation_tokens=128, groups=4, group_size=4, max_batch_tokens=4096, max_open_groups=1,
        max_held_trajectories=1, quick_rounds=1, quick_steps=4, quick_calibration_samples=4,
        quick_calibration_reps=1,
    ),
}  # fmt: skip


def balance_time_scale(
    makespans_units: Sequence[float], sync_work_s: float, idle: float = PAPER_SYNC_IDLE
) -> float:
    """Seconds per trace unit at which a synchronous learner doing ``sync_work_s`` per step idles
    ``idle`` of the step on average over the given makespans (module docstring)."""
    if not (0 < idle < 1) or sync_work_s <= 0 or not makespans_units:
        raise ValueError(f"need 0 < idle < 1, sync work > 0 and makespans; got {idle}, {sync_work_s}")

    def mean_idle(scale: float) -> float:
        return sum(m * scale / (m * scale + sync_work_s) for m in makespans_units) / len(makespans_units)

    lo, hi = 0.0, 1.0
    while mean_idle(hi) < idle:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mean_idle(mid) < idle else (lo, mid)
    return (lo + hi) / 2
