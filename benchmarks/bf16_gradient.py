"""How exact "the update is the synchronous update" is per precision: the first step's gradient.

Four one-step fits of the toy task from the same weights (fp32 values rounded to bf16, so both
precisions start from identical values) on the trace-replay engine (no model in the engine: every
fit sees the same trajectories and rewards): ``streaming`` and ``sync`` x ``32-true`` and
``bf16-true``. Writes ``<out>/bf16_gradient.json`` with the relative L2 differences of the gradient
the optimizer sees, ||g_a - g_b|| / ||g_b||:

- streaming vs sync in fp32 (the exactness claim; float reassociation only),
- streaming vs sync in bf16-true (each trajectory's gradient carries bf16 autograd's rounding, 2^-8,
  before it reaches the fp32 sums; GRPO's zero-mean advantages cancel most of the sum),
- bf16-true vs fp32, per mode.

tests/strategy/test_strategy_bf16.py asserts the same quantities (bf16: 3e-2; fp32: 1e-5).

    .venv/bin/python benchmarks/bf16_gradient.py               # writes benchmarks/results/bf16_gradient.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_common_args, write_result  # noqa: E402
from _harness import fit  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.rollout import TraceReplayEngineConfig  # noqa: E402

MODES = ("streaming", "sync")
PRECISIONS = ("32-true", "bf16-true")


class GradientAtBarrier(Callback):
    """The gradient the optimizer is about to apply (before clipping), flattened, in float64."""

    def __init__(self) -> None:
        self.grads: list[torch.Tensor] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        ps = [p for p in pl_module.parameters() if p.requires_grad]
        self.grads.append(torch.cat([p.grad.detach().reshape(-1).double() for p in ps]))


def first_gradient(mode: str, precision: str, groups: int, group_size: int) -> torch.Tensor:
    L.seed_everything(0)
    policy = GRPOPolicy(config=dict(toy_model_spec().config))
    with torch.no_grad():
        for p in policy.parameters():
            p.copy_(p.to(torch.bfloat16).to(p.dtype))
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=TraceReplayEngineConfig(time_scale_s=0.001),
        group_size=group_size,
        groups_per_step=groups,
        seed=0,
    )
    grads = GradientAtBarrier()
    fit(mode, policy, data, steps=1, callbacks=[grads], trainer_kwargs={"precision": precision})
    return grads.grads[0]


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def main(argv: list[str] | None = None) -> Path:
    parser = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]), default_threads=1)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    g = {(m, p): first_gradient(m, p, args.groups, args.group_size) for m in MODES for p in PRECISIONS}
    payload = {
        "description": "first step's gradient, relative L2 difference, toy policy, trace-replay engine",
        "settings": {"groups": args.groups, "group_size": args.group_size, "threads": args.threads},
        "streaming_vs_sync": {p: relative(g["streaming", p], g["sync", p]) for p in PRECISIONS},
        "bf16_vs_fp32": {m: relative(g[m, "bf16-true"], g[m, "32-true"]) for m in MODES},
        "asserted_in_tests": {"bf16": 3e-2, "fp32_streaming_vs_sync": 1e-5},
    }
    return write_result(args.out, "bf16_gradient", payload)


if __name__ == "__main__":
    print(main())
