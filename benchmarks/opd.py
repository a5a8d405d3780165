"""On-policy distillation vs GRPO on the toy task: steps and wall-clock to a mean reward of 0.9.

Both arms train a freshly initialised student (configs/toy.yaml's tiny Qwen3, AdamW lr 3e-3, grad
clip 1.0, 16 groups x 8 samples, streaming mode) on the multi-turn guessing game:

- ``grpo``: plain GRPO from scratch, ``Objective()`` (the reward is the only signal);
- ``opd``: on-policy distillation alone, ``Objective(opd_coef=1, reward_coef=0)``: the embedded
  engine scores every sampled token with a teacher (``EmbeddedEngineConfig(teacher=TeacherConfig(
  ckpt_path=...))``) and the learner follows the per-token advantage -(logp_student - logp_teacher).
  The reward is measured, never trained on.

The teacher is the demo's trained checkpoint (``make demo`` writes runs/demo/checkpoints/last.ckpt);
when that file does not exist, the benchmark first trains one with the toy config (GRPO, streaming,
``--teacher-steps`` steps) and saves it under ``--runs``.

Reported per arm and seed: the first step whose 10-step moving average of the mean reward reaches
0.9 (``None`` if never within ``--max-steps``) and the wall-clock seconds of the fit up to it. The
verdict latency is off (``latency="none"``), so wall-clock is generation + learner work.

Usage: python benchmarks/opd.py [--quick] [--out DIR] [--threads N] [--teacher PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _common import add_common_args, write_result  # noqa: E402
from _harness import fit, load_average  # noqa: E402
from thundersync_lightning.core import Objective  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.rollout import EmbeddedEngineConfig, TeacherConfig  # noqa: E402

NAME = "opd"
ROOT = Path(__file__).resolve().parents[1]
DEMO_CKPT = ROOT / "runs" / "demo" / "checkpoints" / "last.ckpt"
TOY_MODEL = dict(toy_model_spec().config)  # configs/toy.yaml's model
TARGET, WINDOW = 0.9, 10
ARMS = {
    "opd": Objective(opd_coef=1.0, reward_coef=0.0),
    "grpo": Objective(),
}
COLORS = {"grpo": "tab:red", "opd": "tab:green"}


def _data(args: argparse.Namespace, seed: int, teacher: TeacherConfig | None) -> RolloutDataModule:
    return RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=EmbeddedEngineConfig(num_threads=1, env_workers=8, teacher=teacher, startup_timeout_s=900),
        group_size=args.group_size,
        groups_per_step=args.groups,
        seed=seed,
    )


def train_teacher(args: argparse.Namespace) -> Path:
    """The toy config's GRPO run (what ``make demo`` does), saved as a Lightning checkpoint."""
    path = Path(args.runs) / f"opd-teacher-{args.teacher_steps}" / "last.ckpt"
    if path.exists():
        return path
    print(f"no demo checkpoint at {DEMO_CKPT}: training a teacher for {args.teacher_steps} steps", flush=True)
    torch.manual_seed(0)
    policy = GRPOPolicy(config=TOY_MODEL, lr=3e-3)
    captured: dict[str, Any] = {}

    def keep(trainer: Any, module: Any, stats: Any) -> None:
        captured["trainer"] = trainer
        if trainer.global_step % 25 == 0:
            print(f"  teacher step {trainer.global_step}: reward {mean_reward(stats):.3f}", flush=True)

    record = fit(
        "streaming",
        policy,
        _data(args, 0, None),
        args.teacher_steps,
        on_step=keep,
        trainer_kwargs={"gradient_clip_val": 1.0},
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    captured["trainer"].save_checkpoint(str(path))
    tail = [mean_reward(s) for s in record.steps[-WINDOW:]]
    print(
        f"teacher saved to {path}; last {WINDOW} steps' mean reward {statistics.fmean(tail):.3f}", flush=True
    )
    return path


def mean_reward(stats: Any) -> float:
    """The step's mean reward over its trajectories (this rank's; one rank here)."""
    return statistics.fmean(float(t.reward or 0.0) for t in stats.trajectories)


class _Stop:
    """Stops a fit once the moving average of the step's mean reward reaches the target."""

    def __init__(self, checkpoint: Any = None) -> None:
        self.checkpoint = checkpoint  # called every 10 steps: a run cut short keeps its curve
        self.rewards: list[float] = []
        self.reached: int | None = None
        self.start = time.monotonic()
        self.seconds: float | None = None

    def __call__(self, trainer: Any, module: Any, stats: Any) -> None:
        self.rewards.append(mean_reward(stats))
        window = self.rewards[-WINDOW:]
        if len(self.rewards) % 10 == 0:
            print(f"    step {len(self.rewards)}: moving average {statistics.fmean(window):.3f}", flush=True)
            if self.checkpoint is not None:
                self.checkpoint(self)
        if self.reached is None and len(window) == WINDOW and statistics.fmean(window) >= TARGET:
            self.reached = len(self.rewards)
            self.seconds = time.monotonic() - self.start
            trainer.should_stop = True


def run_arm(args: argparse.Namespace, arm: str, seed: int, teacher: Path) -> dict[str, Any]:
    torch.manual_seed(1000 + seed)  # a fresh student, not the teacher's initialisation
    policy = GRPOPolicy(config=TOY_MODEL, lr=3e-3, objective=ARMS[arm])
    config = TeacherConfig(ckpt_path=str(teacher)) if ARMS[arm].needs_teacher else None

    def record(s: _Stop, done: bool = False) -> dict[str, Any]:
        return {
            "arm": arm,
            "seed": seed,
            "steps_to_target": s.reached,
            "seconds_to_target": s.seconds,
            "rewards": s.rewards,
            "complete": done,
            "seconds": time.monotonic() - s.start,
        }

    def partial(s: _Stop) -> None:
        _write(args, teacher, [*args.done, record(s)], name=f"{NAME}-partial-{arm}-{seed}")

    stop = _Stop(partial)
    fit(
        "streaming",
        policy,
        _data(args, seed, config),
        args.max_steps,
        on_step=stop,
        trainer_kwargs={"gradient_clip_val": 1.0},
    )
    print(f"  {arm} seed {seed}: reached {TARGET} at step {stop.reached} ({stop.seconds} s)", flush=True)
    return record(stop, done=True)


def _plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in runs:
        rewards = r["rewards"]
        smooth = [statistics.fmean(rewards[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(rewards))]
        ax.plot(
            range(1, len(smooth) + 1),
            smooth,
            color=COLORS[r["arm"]],
            alpha=0.8,
            label=r["arm"] if r["seed"] == runs[0]["seed"] else None,
        )
    ax.axhline(TARGET, color="grey", linestyle=":")
    ax.set_xlabel("step")
    ax.set_ylabel(f"mean reward ({WINDOW}-step moving average)")
    ax.set_title("toy task: OPD from the demo checkpoint vs GRPO from scratch")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    parser = add_common_args(argparse.ArgumentParser(description=__doc__), default_threads=1)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--teacher-steps", type=int, default=300)
    parser.add_argument("--teacher", type=Path, default=None, help="a Lightning checkpoint of the toy policy")
    parser.add_argument("--runs", type=Path, default=ROOT / "runs", help="where a trained teacher is kept")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--teacher-only", action="store_true", help="train (or find) the teacher and stop")
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arms to run")
    parser.add_argument("--seed-list", default=None, help="comma-separated seeds (default: 0..seeds-1)")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="*",
        default=None,
        help="combine the runs of these opd.json files (parallel partial runs) and exit",
    )
    args = parser.parse_args(argv)
    args.load_start = load_average()
    if args.quick:
        args.seeds, args.max_steps, args.teacher_steps = 1, 40, 40
    if args.merge:
        parts = [json.loads(p.read_text()) for p in args.merge]
        runs = sorted(
            (r for part in parts for r in part["runs"]), key=lambda r: (list(ARMS).index(r["arm"]), r["seed"])
        )
        args.load_start = [p.get("load_average_start", p.get("load_average")) for p in parts]
        settings = {
            k: v for k, v in parts[0]["settings"].items() if k in ("groups", "group_size", "max_steps")
        }
        args.groups, args.group_size, args.max_steps = (
            settings["groups"],
            settings["group_size"],
            settings["max_steps"],
        )
        _write(args, Path(parts[0]["teacher"]), runs, merged=[str(p) for p in args.merge])
        return
    torch.set_num_threads(args.threads)
    teacher = args.teacher or (DEMO_CKPT if DEMO_CKPT.exists() else train_teacher(args))
    if args.teacher_only:
        return
    seeds = [int(s) for s in args.seed_list.split(",")] if args.seed_list else list(range(args.seeds))
    args.done = runs = []
    for arm in args.arms.split(","):
        for seed in seeds:
            runs.append(run_arm(args, arm, seed, teacher))
            _write(args, teacher, runs)  # after every run: a long benchmark keeps what it measured


def _median_or_none(values: list[float | None], digits: int | None = None) -> float | None:
    med = statistics.median([math.inf if v is None else v for v in values])
    return None if math.isinf(med) else (round(med, digits) if digits is not None else med)


def _write(
    args: argparse.Namespace,
    teacher: Path,
    runs: list[dict[str, Any]],
    merged: list[str] | None = None,
    name: str = NAME,
) -> None:
    summary = {}
    for arm in ARMS:
        mine = [r for r in runs if r["arm"] == arm]
        if not mine:
            continue
        reached = [r for r in mine if r["steps_to_target"] is not None]
        summary[arm] = {
            "reached": f"{len(reached)}/{len(mine)}",
            "steps_to_target": [r["steps_to_target"] for r in mine],
            "steps_run": [len(r["rewards"]) for r in mine],
            "last_moving_average": [
                round(statistics.fmean(r["rewards"][-WINDOW:]), 3) if r["rewards"] else None for r in mine
            ],
            "seconds_to_target": [
                round(r["seconds_to_target"], 1) if r["seconds_to_target"] else None for r in mine
            ],
            # a run that never reached the target counts as infinitely late: a median of None
            # means most seeds did not reach it within their budget
            "median_steps": _median_or_none([r["steps_to_target"] for r in mine]),
            "median_seconds": _median_or_none([r["seconds_to_target"] for r in mine], digits=1),
        }
        print(arm, summary[arm], flush=True)
    payload = {
        "teacher": str(teacher),
        "target": TARGET,
        "window": WINDOW,
        "settings": {
            "groups": args.groups,
            "group_size": args.group_size,
            "max_steps": args.max_steps,
            "threads": args.threads,
            "latency": "none",
            "mode": "streaming",
        },
        "objectives": {arm: obj.to_dict() for arm, obj in ARMS.items()},
        "summary": summary,
        "runs": runs,
        "load_average_start": args.load_start,
        "load_average_end": load_average(),
        "merged_from": merged,
    }
    write_result(args.out, name, payload)
    _plot(runs, Path(args.out) / f"{name}.png")


if __name__ == "__main__":
    main()
