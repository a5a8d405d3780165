"""Dynamic sampling (DAPO) on the toy task: steps, and groups generated, to a mean-reward target.

Both arms train configs/toy.yaml's tiny Qwen3 from the same initialisation (AdamW lr 3e-3, grad clip
1.0, streaming mode) on the multi-turn guessing game without verdict latency:

- ``off``: ``groups_per_step`` groups per step, uninformative ones (every reward equal) included;
- ``on``: ``RolloutDataModule(dynamic_sampling=True, max_extra_groups=groups_per_step)``: a group
  without signal counts nowhere and is replaced at once from the same weights, up to
  ``groups_per_step`` replacements per step.

Reported per arm and seed: the first step whose ``--window``-step moving average of the step's mean
reward (over every trajectory generated, replacements included) reaches ``--target`` (None if never
within ``--max-steps``), the groups generated up to that step (the rollout cost) and the curve.

Usage: python benchmarks/dynamic_sampling.py [--quick] [--out DIR] [--threads N] [--seeds N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _common import add_common_args, write_result  # noqa: E402
from _harness import fit, load_average  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.rollout import EmbeddedEngineConfig  # noqa: E402

NAME = "dynamic_sampling"
TOY_MODEL = dict(toy_model_spec().config)  # configs/toy.yaml's model
ARMS = ("off", "on")


def _data(args: argparse.Namespace, arm: str, seed: int) -> RolloutDataModule:
    extra = {"dynamic_sampling": True, "max_extra_groups": args.groups} if arm == "on" else {}
    return RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=EmbeddedEngineConfig(num_threads=1, env_workers=8),
        group_size=args.group_size,
        groups_per_step=args.groups,
        seed=seed,
        **extra,
    )


class _Curve:
    """Per step: mean reward, groups generated / kept / dropped; stops at the target."""

    def __init__(self, target: float, window: int) -> None:
        self.target, self.window = target, window
        self.steps: list[dict[str, float]] = []
        self.reached: int | None = None
        self.start = time.monotonic()

    def __call__(self, trainer: Any, module: Any, stats: Any) -> None:
        rewards = [float(t.reward or 0.0) for t in stats.trajectories]
        self.steps.append({
            "reward_mean": statistics.fmean(rewards),
            "groups_generated": stats.groups_generated,
            "groups_kept": stats.groups_folded,
            "groups_dropped": stats.groups_filtered,
        })  # fmt: skip
        window = [s["reward_mean"] for s in self.steps[-self.window :]]
        if self.reached is None and len(window) == self.window and statistics.fmean(window) >= self.target:
            self.reached = len(self.steps)
            trainer.should_stop = True


def run_arm(args: argparse.Namespace, arm: str, seed: int) -> dict[str, Any]:
    torch.manual_seed(seed)  # the same initialisation for both arms of a seed
    policy = GRPOPolicy(config=TOY_MODEL, lr=3e-3)
    curve = _Curve(args.target, args.window)
    fit("streaming", policy, _data(args, arm, seed), args.max_steps, on_step=curve,
        trainer_kwargs={"gradient_clip_val": 1.0})  # fmt: skip
    upto = curve.steps[: curve.reached] if curve.reached else curve.steps
    print(f"  {arm} seed {seed}: target at step {curve.reached}", flush=True)
    return {
        "arm": arm,
        "seed": seed,
        "steps_to_target": curve.reached,
        "groups_generated_to_target": sum(s["groups_generated"] for s in upto) if curve.reached else None,
        "seconds": round(time.monotonic() - curve.start, 1),
        "steps": curve.steps,
    }


def main(argv: list[str] | None = None) -> None:
    parser = add_common_args(argparse.ArgumentParser(description=__doc__), default_threads=1)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=300)
    parser.add_argument("--target", type=float, default=0.6)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    args = parser.parse_args(argv)
    if args.quick:
        args.seeds, args.max_steps, args.groups, args.target = 2, 80, 8, 0.4
    load_start = load_average()
    torch.set_num_threads(args.threads)
    runs = [run_arm(args, arm, seed) for seed in range(args.seeds) for arm in ARMS]
    summary = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        summary[arm] = {
            "reached": f"{sum(r['steps_to_target'] is not None for r in mine)}/{len(mine)}",
            "steps_to_target": [r["steps_to_target"] for r in mine],
            "groups_generated_to_target": [r["groups_generated_to_target"] for r in mine],
            "last_moving_average": [
                round(statistics.fmean(s["reward_mean"] for s in r["steps"][-args.window :]), 3) for r in mine
            ],
            "groups_dropped_per_step": round(
                statistics.fmean(s["groups_dropped"] for r in mine for s in r["steps"]), 2
            ),
        }
        print(arm, summary[arm], flush=True)
    write_result(args.out, NAME, {
        "target": args.target,
        "window": args.window,
        "settings": {"groups": args.groups, "group_size": args.group_size, "max_steps": args.max_steps,
                     "seeds": args.seeds, "threads": args.threads, "latency": "none", "mode": "streaming"},
        "summary": summary,
        "runs": runs,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    })  # fmt: skip


if __name__ == "__main__":
    main()
