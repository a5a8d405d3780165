"""bf16 parameters: fp32 sums and held gradients, the final ``.grad`` in bf16.

Tolerance (see tests/strategy/test_strategy_bf16.py for the reasoning): each trajectory's gradient comes
out of bf16 autograd (unit roundoff 2^-8), so the step's gradient matches the fp32 one to a few
bf16 roundoffs; asserted 3e-2 relative.
"""

from __future__ import annotations

import torch

from thundersync_lightning.core import StreamingGRPO

from ..helpers import Batch, MLPPolicy, reference_gradient, relative_error, stream

BF16_TOLERANCE = 3e-2


def same_weights_in(dtype: torch.dtype) -> MLPPolicy:
    """The fp32 policy's weights rounded to bf16, held in ``dtype`` (identical values)."""
    policy = MLPPolicy(torch.float32)
    with torch.no_grad():
        for p in policy.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    return policy.to(dtype) if dtype != torch.float32 else policy


def test_bf16_parameters_are_accumulated_in_fp32_and_get_a_bf16_grad():
    policy = same_weights_in(torch.bfloat16)
    policy.dtype = torch.bfloat16
    params = list(policy.parameters())
    numel = sum(p.numel() for p in params)
    acc = StreamingGRPO(params)
    acc.open_group("g0", ("g0-t0", "g0-t1"))
    acc.add_logprob("g0-t0", policy.score("g0-t0"))  # held: one fp32 buffer
    assert acc.bytes_in_use.total == numel * 4
    acc.add_reward("g0-t0", 1.0)
    acc.add_reward("g0-t1", 0.0)
    acc.add_logprob("g0-t1", policy.score("g0-t1"))
    acc.finish()
    assert {p.grad.dtype for p in params} == {torch.bfloat16}


def test_a_bf16_streamed_gradient_matches_the_fp32_reference_within_bf16_tolerance():
    batch = Batch.of([1.0, 0.0, 0.5, 1.0], [0.0, 1.0, 1.0], [2.0, 0.0])
    fp32 = same_weights_in(torch.float32)
    bf16 = same_weights_in(torch.bfloat16)
    bf16.dtype = torch.bfloat16
    want = reference_gradient(list(fp32.parameters()), batch, fp32.score)
    events = batch.events()
    late_rewards = [e for e in events if e[0] == "logprob"] + [e for e in events if e[0] == "reward"]
    for order in (events, late_rewards):  # direct path (sync-like) and held gradients (streaming)
        got, _ = stream(list(bf16.parameters()), batch, bf16.score, order)
        assert relative_error(got, want) <= BF16_TOLERANCE
