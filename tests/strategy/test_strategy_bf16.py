"""bf16 weights train with fp32 sums: the gradient matches an fp32 run within bf16 tolerance.

The trace-replay engine runs no model, so every run sees the same trajectories and rewards
whatever the learner's precision. Every run starts from the same weights (fp32 weights rounded to
bf16, so both precisions hold identical values).

Tolerance: each trajectory's gradient is computed by bf16 autograd (unit roundoff 2^-8 ~ 0.4%)
before it reaches the fp32 sums, and GRPO's zero-mean advantages cancel most of the sum, so the
relative difference of the step's gradient is a few bf16 roundoffs. Measured on this toy model:
bf16 vs fp32 0.8% (streaming and sync), bf16 streaming vs bf16 sync 0.6%; fp32 streaming vs sync
3e-7. Asserted: BF16_TOLERANCE = 3e-2 (relative L2 norm).
"""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch

from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import TraceReplayEngineConfig

from ._fit import TOY_MODEL, fit
from .test_objective_checks_modes import GradientAtBarrier

BF16_TOLERANCE = 3e-2


def first_gradient(mode: str, precision: str, dtype: str = "float32") -> tuple[torch.Tensor, Any, Any]:
    """(the first step's gradient as the optimizer sees it, its StepStats, the policy)."""
    L.seed_everything(0)
    policy = GRPOPolicy(config=TOY_MODEL, dtype=dtype)
    with torch.no_grad():
        for p in policy.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=TraceReplayEngineConfig(time_scale_s=0.001),
        group_size=4,
        groups_per_step=4,
        seed=0,
    )
    grads = GradientAtBarrier()
    _, steps, _ = fit(mode, steps=1, policy=policy, data=data, precision=precision, callbacks=[grads])
    return grads.grads[0], steps[0], policy


@pytest.fixture(scope="module")
def runs():
    return {(m, p): first_gradient(m, p) for m in ("streaming", "sync") for p in ("32-true", "bf16-true")}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("mode", ["streaming", "sync"])
def test_a_bf16_true_run_gives_the_fp32_gradient_within_bf16_tolerance(runs, mode):
    bf16, stats, policy = runs[mode, "bf16-true"]
    fp32 = runs[mode, "32-true"][0]
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16} and bf16.dtype == torch.bfloat16
    assert float(fp32.norm()) > 0
    assert relative(bf16, fp32) <= BF16_TOLERANCE
    assert {t.staleness for t in stats.trajectories} == {0}


def test_bf16_streaming_equals_bf16_sync_within_bf16_tolerance_and_fp32_much_closer(runs):
    assert relative(runs["streaming", "bf16-true"][0], runs["sync", "bf16-true"][0]) <= BF16_TOLERANCE
    assert relative(runs["streaming", "32-true"][0], runs["sync", "32-true"][0]) <= 1e-5


def test_a_policy_built_in_bfloat16_trains_like_bf16_true_precision(runs):
    grad, _, policy = first_gradient("streaming", "32-true", dtype="bfloat16")
    assert {p.dtype for p in policy.parameters()} == {torch.bfloat16}
    assert relative(grad, runs["streaming", "bf16-true"][0]) <= BF16_TOLERANCE
