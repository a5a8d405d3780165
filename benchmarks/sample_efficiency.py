"""Sample efficiency: the toy agent task in sync, streaming and async modes, same seeds.

Each mode trains the same randomly initialised tiny Qwen3 (configs/toy.yaml's architecture) on
the multi-turn guessing game (``GuessingGameTasks``, simulated long-tailed verdict latency) with
the embedded engine generating real rollouts, through a Lightning ``Trainer`` with
``ThunderSyncStrategy``. Seeds are identical: same initial weights, same tasks, same per-trajectory
sampling seeds. What it shows:

- reward vs step: streaming and sync take the same update each step (the streaming gradient is the
  synchronous one up to floating-point summation order), so their curves coincide; async trains
  on rollouts one version old (staleness 1) and follows its own path;
- reward vs wall-clock: the same curves against seconds since the fit started (streaming gets
  there sooner because its learner works while verdicts are pending);
- parameter distance to the synchronous run, ||theta_mode - theta_sync|| / ||theta_sync - theta_0||
  (relative to how far sync training moved the weights), every few steps, async's is O(1).
  With AdamW (the policy's optimizer) streaming's is float noise only for the first steps: Adam's
  early updates are ~lr * g / (|g| + eps), sign-like for gradient components at float-noise size,
  so summation-order noise becomes ~1e-4 of the update, and once one sampled token differs the two
  runs' rollouts (and rewards) part ways. The SGD check therefore repeats sync and streaming with
  plain SGD (no per-coordinate rescaling): there the distance must stay at float noise (~1e-6) and
  the rewards identical step for step.

Runs are sequential (one mode after the other: a run is N consecutive optimizer steps); wall-clock
curves therefore carry the machine's load at the time, which is recorded per mode.

Usage: python benchmarks/sample_efficiency.py [--quick] [--out DIR] [--threads N]
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
from _harness import MODE_COLORS, MODES, fit, flat_params, load_average  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.rollout import EmbeddedEngineConfig  # noqa: E402

NAME = "sample_efficiency"
#: configs/toy.yaml's model
TOY_MODEL = {
    "vocab_size": 16,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 1,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 64,
    "tie_word_embeddings": False,
}


class SGDPolicy(GRPOPolicy):
    """The same policy with plain SGD (no per-coordinate normalisation), for the float-noise check."""

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD([p for p in self.parameters() if p.requires_grad], lr=self.hparams.lr)


def run_mode(
    args: argparse.Namespace, mode: str, sgd: bool = False, steps: int | None = None
) -> dict[str, Any]:
    steps = steps or args.steps
    torch.manual_seed(args.seed)
    policy = (SGDPolicy if sgd else GRPOPolicy)(config=TOY_MODEL, lr=args.sgd_lr if sgd else args.lr)
    theta0 = flat_params(policy)
    snapshots: dict[int, torch.Tensor] = {}
    rewards: list[float] = []
    per_trajectory: list[dict[str, float]] = []

    def on_step(trainer: Any, module: Any, stats: Any) -> None:
        values = {t.trajectory_id: t.reward for t in stats.trajectories}
        per_trajectory.append(values)
        rewards.append(statistics.mean(v for v in values.values() if v is not None))
        done = len(rewards)
        if done % args.distance_every == 0 or done == steps or done == 1:
            snapshots[done] = flat_params(module)

    data = RolloutDataModule(
        tasks=GuessingGameTasks(
            num_digits=10,
            max_turns=4,
            latency="lognormal" if args.latency_median > 0 else "none",
            latency_median_s=args.latency_median,
            latency_sigma=args.latency_sigma,
        ),
        engine=EmbeddedEngineConfig(temperature=1.0, num_threads=1, env_workers=32),
        group_size=args.group_size,
        groups_per_step=args.groups,
        seed=args.seed,
    )
    load = load_average()
    started = time.monotonic()
    record = fit(
        mode,
        policy,
        data,
        steps,
        trainer_kwargs={"gradient_clip_val": 1.0},
        on_step=on_step,
    )
    t0 = record.steps[0].step_start
    return {
        "rewards": rewards,
        "per_trajectory_rewards": per_trajectory,
        "wall_s": [s.step_end - t0 for s in record.steps],
        "step_s": [b.step_end - a.step_end for a, b in zip(record.steps, record.steps[1:])],
        "staleness_max": max(s.staleness_max for s in record.steps),
        "fit_seconds": time.monotonic() - started,
        "snapshots": snapshots,
        "theta0": theta0,
        "load_average_at_start": load,
    }


def figure(
    path: str,
    runs: dict[str, dict],
    distances: dict[str, dict[int, float]],
    args: argparse.Namespace,
    sgd_distance: dict[int, float],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def smooth(xs: list[float], k: int = 10) -> list[float]:
        return [statistics.mean(xs[max(0, i - k + 1) : i + 1]) for i in range(len(xs))]

    fig, axes = plt.subplots(1, 3, figsize=(15, 4), dpi=100)
    for mode in MODES:
        r = runs[mode]
        style = {"color": MODE_COLORS[mode], "label": mode, "linestyle": "--" if mode == "streaming" else "-"}
        steps = list(range(1, len(r["rewards"]) + 1))
        axes[0].plot(steps, smooth(r["rewards"]), **style)
        axes[1].plot(r["wall_s"], smooth(r["rewards"]), **style)
    axes[0].set_xlabel("optimizer step")
    axes[0].set_ylabel("mean reward (10-step moving average)")
    axes[0].set_title("reward vs step (streaming dashed over sync)", fontsize=9)
    axes[1].set_xlabel("seconds since the first step started")
    axes[1].set_title("reward vs wall-clock", fontsize=9)
    for mode in ("streaming", "async"):
        d = distances[mode]
        ys = [max(v, 1e-12) for v in d.values()]
        axes[2].semilogy(list(d), ys, marker="o", color=MODE_COLORS[mode], label=f"{mode} vs sync")
    axes[2].semilogy(
        list(sgd_distance),
        [max(v, 1e-12) for v in sgd_distance.values()],
        marker="x",
        color="k",
        linestyle=":",
        label="streaming vs sync, SGD",
    )
    axes[2].set_xlabel("optimizer step")
    axes[2].set_ylabel("||theta - theta_sync|| / ||theta_sync - theta_0||")
    axes[2].set_title("parameter distance to the synchronous run", fontsize=9)
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"guessing game, {args.groups} groups x {args.group_size}, {args.steps} steps, "
        f"verdict latency log-normal median {args.latency_median * 1e3:.0f} ms sigma {args.latency_sigma}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)  # 2 OpenMP threads stall on a shared 2-core VM (README)
    parser.add_argument(
        "--steps", type=int, default=None, help="optimizer steps per mode (default 200, quick 30)"
    )
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--latency-median", type=float, default=0.03, help="verdict latency median, s (0: none)"
    )
    parser.add_argument("--latency-sigma", type=float, default=1.0)
    parser.add_argument("--distance-every", type=int, default=None, help="(default steps // 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--sgd-steps", type=int, default=None, help="steps of the SGD check (default min(steps, 50))"
    )
    parser.add_argument("--sgd-lr", type=float, default=0.05)
    args = parser.parse_args(argv)
    args.steps = args.steps or (30 if args.quick else 200)
    args.distance_every = args.distance_every or max(1, args.steps // 10)
    torch.set_num_threads(args.threads)
    load_start = load_average()

    runs = {}
    for mode in MODES:
        runs[mode] = run_mode(args, mode)
        r = runs[mode]
        print(
            f"{mode}: {args.steps} steps in {r['fit_seconds']:.1f} s, reward first 10 "
            f"{statistics.mean(r['rewards'][:10]):.3f}, last 10 {statistics.mean(r['rewards'][-10:]):.3f} "
            f"(load {load_average()})",
            flush=True,
        )

    sync = runs["sync"]
    moved = {k: float((v - sync["theta0"]).norm()) for k, v in sync["snapshots"].items()}
    distances: dict[str, dict[int, float]] = {}
    max_abs: dict[str, float] = {}
    for mode in ("streaming", "async"):
        snaps = runs[mode]["snapshots"]
        distances[mode] = {
            k: float((snaps[k] - sync["snapshots"][k]).norm()) / moved[k] for k in sorted(snaps)
        }
        max_abs[mode] = float((snaps[args.steps] - sync["snapshots"][args.steps]).abs().max())
    # float-noise check: sync and streaming again with plain SGD, which does not rescale tiny gradient
    # components the way Adam's first steps do (update ~ lr * g / (|g| + eps): sign-level for |g| ~ eps)
    sgd_steps = args.sgd_steps or min(args.steps, 50)
    sgd_runs = {mode: run_mode(args, mode, sgd=True, steps=sgd_steps) for mode in ("sync", "streaming")}
    sgd_moved = {
        k: float((v - sgd_runs["sync"]["theta0"]).norm()) for k, v in sgd_runs["sync"]["snapshots"].items()
    }
    sgd_distance = {
        k: float((v - sgd_runs["sync"]["snapshots"][k]).norm()) / sgd_moved[k]
        for k, v in sorted(sgd_runs["streaming"]["snapshots"].items())
    }
    sgd_same = sum(
        a == b
        for a, b in zip(
            sgd_runs["streaming"]["per_trajectory_rewards"], sgd_runs["sync"]["per_trajectory_rewards"]
        )
    )
    print(
        f"SGD check, {sgd_steps} steps: streaming vs sync {sgd_distance[sgd_steps]:.2e}, identical rewards "
        f"in {sgd_same}/{sgd_steps} steps",
        flush=True,
    )
    same_rewards = {
        mode: sum(
            a == b for a, b in zip(runs[mode]["per_trajectory_rewards"], sync["per_trajectory_rewards"])
        )
        for mode in ("streaming", "async")
    }
    modes = {}
    for mode in MODES:
        r = runs[mode]
        modes[mode] = {
            "reward_by_step": r["rewards"],
            "wall_s_by_step": r["wall_s"],
            "median_step_s": statistics.median(r["step_s"]),
            "reward_first_10": statistics.mean(r["rewards"][:10]),
            "reward_last_10": statistics.mean(r["rewards"][-10:]),
            "total_seconds": r["wall_s"][-1],
            "staleness_max": r["staleness_max"],
            "load_average_at_start": r["load_average_at_start"],
        }
    results = {
        "description": (
            "toy guessing game, three modes, same seeds: reward vs step / wall-clock, parameter distance"
        ),
        "steps": args.steps,
        "param_distance_streaming_vs_sync": distances["streaming"][args.steps],
        "param_distance_async_vs_sync": distances["async"][args.steps],
        "param_distance_definition": (
            "||theta_mode - theta_sync||_2 / ||theta_sync - theta_0||_2 after the same number of steps"
        ),
        "param_distance_by_step": {m: {str(k): v for k, v in d.items()} for m, d in distances.items()},
        "param_max_abs_diff_vs_sync": max_abs,
        "param_distance_after_1_step": {m: distances[m][1] for m in ("streaming", "async")},
        "first_step_with_different_rewards": {
            m: next(
                (
                    i
                    for i, (a, b) in enumerate(
                        zip(runs[m]["per_trajectory_rewards"], sync["per_trajectory_rewards"])
                    )
                    if a != b
                ),
                None,
            )
            for m in ("streaming", "async")
        },
        "sgd_check": {
            "optimizer": f"SGD(lr={args.sgd_lr})",
            "steps": sgd_steps,
            "param_distance_streaming_vs_sync": sgd_distance[sgd_steps],
            "param_distance_by_step": {str(k): v for k, v in sgd_distance.items()},
            "param_max_abs_diff": float(
                (sgd_runs["streaming"]["snapshots"][sgd_steps] - sgd_runs["sync"]["snapshots"][sgd_steps])
                .abs()
                .max()
            ),
            "steps_with_identical_rewards": sgd_same,
            "reward_by_step": {m: r["rewards"] for m, r in sgd_runs.items()},
        },
        "steps_with_identical_rewards_vs_sync": same_rewards,
        "speedup_streaming_vs_sync_wall": modes["sync"]["total_seconds"]
        / modes["streaming"]["total_seconds"],
        "modes": modes,
        "workload": {
            "task": "GuessingGameTasks(num_digits=10, max_turns=4)",
            "latency": {
                "distribution": "lognormal",
                "median_s": args.latency_median,
                "sigma": args.latency_sigma,
            },
            "engine": "EmbeddedEngineConfig(temperature=1.0, num_threads=1, env_workers=32)",
            "model": TOY_MODEL,
            "groups": args.groups,
            "group_size": args.group_size,
            "lr": args.lr,
            "gradient_clip_val": 1.0,
            "seed": args.seed,
        },
        "threads": args.threads,
        "quick": args.quick,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    path = write_result(args.out, NAME, results)
    figure(str(path.with_suffix(".png")), runs, distances, args, sgd_distance)
    print(
        f"param distance after {args.steps} steps: streaming vs sync "
        f"{distances['streaming'][args.steps]:.2e}, async vs sync {distances['async'][args.steps]:.2e}; "
        f"steps with identical rewards {same_rewards}"
    )
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
