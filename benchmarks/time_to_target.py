"""Time to target: wall-clock and steps until the 10-step moving average of the reward reaches 0.9.

Each run is one real Lightning fit of the toy task (the embedded engine, a random tiny Qwen3,
AdamW, gradient clipping 1.0) that stops at the first step whose moving average of the step's mean
reward over the last 10 steps is >= 0.9, or at its budget (``--max-steps``): then it counts as
not reached, with the budget stated. Seconds are measured from the first step's start (the engine
already running) to the end of the step that reached the target.

Modes (``ThunderSyncStrategy(mode=...)`` and the policy's objective):

    sync        the synchronous baseline
    streaming   zero staleness, learner overlapped with the rollouts
    async       one-step off-policy, the plain objective
    async_is    one-step off-policy with the importance correction (``Objective(is_correction=
                "token_truncate")``, TRL's truncated IS with cap 3): the fair peer baseline

Workloads:

    toy         configs/toy.yaml as configured (16 x 8, lr 3e-3, verdict latency log-normal
                median 30 ms, sigma 1)
    balanced    the paper's balance: the same game on a model twice as wide (hidden 128,
                ``--balanced-hidden``) with the verdict latency cut (``--balanced-latency-median-s``,
                default 0.002 s), so that the synchronous learner idles ~50% of the step instead
                of the toy's: the learner's share of the step is the paper's. Every sync run
                reports its measured idle fraction (``sync_idle_fraction``), so the balance is
                checked, not assumed. ``--balanced-context-tokens`` lengthens every prompt by a
                shared context (``GuessingGameTasks(context_tokens=...)``: the learner's work set
                by tokens rather than per-call overheads) and ``--balanced-groups`` sets the
                groups per step; neither is the default (a wider model was unstable at lr 3e-3).

Per workload and mode: ``median_seconds`` and ``median_steps`` over seeds (a run not reached counts
as +inf; a median that falls on one is ``None``), min / max, runs reached, seconds per step, and
where a step's time goes: ``last_verdict_s_median`` (step start to the step's last verdict) and
``after_last_verdict_s_median`` (from it to the step's end: the learner's leftover work, the
barrier and the optimizer). A zero-staleness step cannot end before its own last verdict, so
streaming's ``last_verdict_over_sync_step`` is the floor of its per-step ratio to sync
(``step_over_sync_step``) however fast its learner. Nor can it work on a trajectory before its
content lands: ``release_floor_s_median`` is, per step, the larger of the last verdict and
``overlap.py``'s release-date bound (:func:`_overlap_bound.release_bound`): every trajectory's
learner work at sync's rate, started no earlier than its content landed (the rate: a sync run's own
``learner_s_per_token_median``, for the other modes the median over the workload's sync runs before
them; the barrier and the optimizer left out). No learner at sync's rate ends a step sooner once
its content lands when it does; at zero staleness (sync, streaming) the content cannot land sooner
either (async's began a step early, so its floor only bounds its own learner).
``release_floor_over_sync_step`` divides streaming's by sync's ``step_s_median`` (median step;
``step_median_over_sync_step`` likewise). ``time_to_target.json`` is rewritten after every run and a later
invocation skips runs already in it with the same settings (``--no-resume`` to redo them), so a long
run can be stopped and continued.

Usage: python benchmarks/time_to_target.py [--quick] [--out DIR] [--seeds 0 1 2] [--workloads toy balanced]
"""

from __future__ import annotations

import argparse
import inspect
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

from _common import add_call_cap_args, add_common_args, add_split_backward_arg, write_result  # noqa: E402
from _harness import MODE_COLORS, fit, load_average  # noqa: E402
from _overlap_bound import release_bound  # noqa: E402
from thundersync_lightning.core import Objective  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.rollout import EmbeddedEngineConfig  # noqa: E402
from thundersync_lightning.strategy import ThunderSyncStrategy  # noqa: E402

NAME = "time_to_target"
TARGET, WINDOW = 0.9, 10
MODES = {
    "sync": ("sync", Objective()),
    "streaming": ("streaming", Objective()),
    "async": ("async", Objective()),
    "async_is": ("async", Objective(is_correction="token_truncate")),
}
COLORS = {**MODE_COLORS, "async_is": "tab:purple"}
TOY_MODEL = dict(toy_model_spec().config)  # configs/toy.yaml's model
TARGETS = {"streaming_over_async_max": 1.0, "streaming_over_sync_max_balanced": 0.6}


def workload(args: argparse.Namespace, name: str) -> tuple[dict, GuessingGameTasks]:
    """(model config, tasks) of a workload."""
    if name == "toy":
        return TOY_MODEL, GuessingGameTasks(
            num_digits=8, max_turns=4, latency_median_s=0.03, latency_sigma=1.0
        )
    hidden = args.balanced_hidden
    tasks = GuessingGameTasks(
        num_digits=8,
        max_turns=4,
        latency_median_s=args.balanced_latency_median_s,
        latency_sigma=1.0,
        context_tokens=args.balanced_context_tokens,
    )
    return balanced_model(hidden, tasks.model_spec().config["max_position_embeddings"]), tasks


def balanced_model(hidden: int, max_positions: int = 64) -> dict:
    """The balanced workload's Qwen3: the toy's, ``hidden`` wide (head_dim stays 64, as the toy's 4 heads)."""
    return {
        **TOY_MODEL,
        "hidden_size": hidden,
        "intermediate_size": 2 * hidden,
        "num_attention_heads": max(1, hidden // 16),
        "max_position_embeddings": max_positions,
    }


def groups(args: argparse.Namespace, name: str) -> int:
    return args.groups if name == "toy" else args.balanced_groups


class _Until:
    """Stops a fit when the moving average of the step's mean reward reaches the target."""

    def __init__(self) -> None:
        self.rewards: list[float] = []
        self.elapsed: list[float] = []  # seconds from the first step's start to each step's end
        self.idle: list[float] = []
        self.last_verdict: list[float | None] = []  # per step: seconds from its start to its last verdict
        self.after_verdict: list[float] = []  # seconds from the last verdict to the step's end
        self.first_start: float | None = None
        self.reached: int | None = None
        self.seconds: float | None = None
        self.last_end: float | None = None
        self.step_s: list[float] = []
        self.arrivals: list[
            list[tuple[float, int]]
        ] = []  # per step: (content landed after its start, tokens)
        self.rates: list[float] = []  # per step: the learner's backward and fold seconds per token

    def floors(self, rate: float) -> list[float]:
        """Per step:
        the release-date floor at ``rate`` seconds of learner work per token (module docstring)."""
        return [
            max(verdict or 0.0, release_bound(arrivals, 1.0, rate * sum(n for _, n in arrivals)))
            for verdict, arrivals in zip(self.last_verdict, self.arrivals)
        ]

    def __call__(self, trainer: Any, module: Any, stats: Any) -> None:
        self.step_s.append(stats.step_end - stats.step_start)
        arrivals = [(t.content_ready_at - stats.step_start, t.num_tokens) for t in stats.trajectories]
        self.arrivals.append(arrivals)
        work = sum(i.seconds for i in stats.busy if i.kind in ("backward", "fold"))
        self.rates.append(work / max(1, sum(n for _, n in arrivals)))
        self.rewards.append(statistics.fmean(float(t.reward or 0.0) for t in stats.trajectories))
        if self.first_start is None:
            self.first_start = stats.step_start
        self.elapsed.append(stats.step_end - self.first_start)
        if self.last_end is not None:  # idle over the period between step ends (step 0 has none)
            busy = sum(i.seconds for i in stats.busy)
            self.idle.append(max(0.0, 1.0 - busy / (stats.step_end - self.last_end)))
        self.last_end = stats.step_end
        verdicts = [t.reward_ready_at for t in stats.trajectories if t.reward_ready_at is not None]
        self.last_verdict.append(max(verdicts) - stats.step_start if verdicts else None)
        if verdicts:
            self.after_verdict.append(stats.step_end - max(verdicts))
        window = self.rewards[-WINDOW:]
        if self.reached is None and len(window) == WINDOW and statistics.fmean(window) >= TARGET:
            self.reached = len(self.rewards)
            self.seconds = stats.step_end - self.first_start
            trainer.should_stop = True


def run_one(
    args: argparse.Namespace, name: str, mode: str, seed: int, floor_rate: float | None = None
) -> dict:
    """One fit; ``floor_rate``: sync's learner seconds per token for the release-date floor (None: a
    sync run uses its own, any other run records no floor)."""
    model, tasks = workload(args, name)
    strategy_mode, objective = MODES[mode]
    torch.manual_seed(seed)
    policy = GRPOPolicy(config=model, lr=args.lr, objective=objective)
    data = RolloutDataModule(
        tasks=tasks,
        engine=EmbeddedEngineConfig(temperature=1.0, num_threads=1, env_workers=32, startup_timeout_s=900),
        group_size=args.group_size,
        groups_per_step=groups(args, name),
        seed=seed,
    )
    until = _Until()
    started = time.monotonic()
    fit(
        strategy_mode,
        policy,
        data,
        args.max_steps,
        on_step=until,
        trainer_kwargs={"gradient_clip_val": 1.0},
        split_backward=args.split_backward,
        max_batch_trajectories=args.max_batch_trajectories,
        max_batch_tokens=args.max_batch_tokens,
        min_batch_trajectories=args.min_batch_trajectories,
    )
    assert until.first_start is not None and until.last_end is not None
    rate = (
        floor_rate if floor_rate is not None else (statistics.median(until.rates) if mode == "sync" else None)
    )
    return {
        "workload": name,
        "mode": mode,
        "seed": seed,
        "reached": until.reached is not None,
        "steps": until.reached,
        "seconds": until.seconds,
        "budget_steps": args.max_steps,
        "steps_run": len(until.rewards),
        "seconds_run": until.last_end - until.first_start,
        "fit_seconds": time.monotonic() - started,
        "rewards": until.rewards,
        "elapsed_s": until.elapsed,
        "sync_idle_fraction": statistics.median(until.idle) if mode == "sync" and until.idle else None,
        "learner_idle_fraction": statistics.median(until.idle) if until.idle else None,
        "last_verdict_s_median": _median([v for v in until.last_verdict if v is not None]),
        "after_last_verdict_s_median": statistics.median(until.after_verdict)
        if until.after_verdict
        else None,
        "step_s_median": statistics.median(until.step_s),
        "learner_s_per_token_median": statistics.median(until.rates),
        "release_floor_rate_s_per_token": rate,
        "release_floor_s_median": statistics.median(until.floors(rate)) if rate is not None else None,
        "settings": settings(args, name, mode),
    }


def settings(args: argparse.Namespace, name: str, mode: str) -> dict:
    """What makes two runs comparable: a stored run with other settings is redone."""
    model, tasks = workload(args, name)
    out = {
        "max_steps": args.max_steps,
        "groups": groups(args, name),
        "group_size": args.group_size,
        "lr": args.lr,
        "threads": args.threads,
        "hidden": model["hidden_size"],
        "latency_median_s": tasks.latency_median_s,
    }
    if tasks.context_tokens:
        out["context_tokens"] = tasks.context_tokens
    defaults = inspect.signature(ThunderSyncStrategy).parameters
    for key in ("max_batch_trajectories", "max_batch_tokens"):  # stored only when not the default,
        if getattr(args, key) != defaults[key].default:  # so earlier runs still match
            out[key] = getattr(args, key)
    if mode != "sync":  # always stored (no effect in sync): runs before the option waited for nothing
        out["min_batch_trajectories"] = args.min_batch_trajectories
    if mode == "streaming":  # the split only changes streaming's learner calls
        out["split_backward"] = args.split_backward
    return out


def _median(values: list[float]) -> float | None:
    m = statistics.median(values) if values else math.inf
    return None if math.isinf(m) else m


def summarise(runs: list[dict]) -> dict:
    """Per mode: medians over seeds (not reached = +inf), spread, runs reached, budget."""
    out: dict[str, dict] = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        seconds = [r["seconds"] if r["reached"] else math.inf for r in mine]
        steps = [float(r["steps"]) if r["reached"] else math.inf for r in mine]
        reached_s = [s for s in seconds if not math.isinf(s)]
        reached_k = [s for s in steps if not math.isinf(s)]
        idle = [r["learner_idle_fraction"] for r in mine if r["learner_idle_fraction"] is not None]
        out[mode] = {
            "median_seconds": _median(seconds),
            "median_steps": _median(steps),
            "seconds_min_max_reached": [min(reached_s), max(reached_s)] if reached_s else None,
            "steps_min_max_reached": [min(reached_k), max(reached_k)] if reached_k else None,
            "reached": f"{len(reached_s)}/{len(mine)}",
            "budget_steps": max(r["budget_steps"] for r in mine),
            "seeds": [r["seed"] for r in mine],
            "learner_idle_fraction_median": statistics.median(idle) if idle else None,
            "seconds_per_step_median": statistics.median(r["seconds_run"] / r["steps_run"] for r in mine),
            "last_verdict_s_median": _median(
                [r["last_verdict_s_median"] for r in mine if r.get("last_verdict_s_median") is not None]
            ),
            "after_last_verdict_s_median": _median(
                [
                    r["after_last_verdict_s_median"]
                    for r in mine
                    if r.get("after_last_verdict_s_median") is not None
                ]
            ),
            "step_s_median": _median(
                [r["step_s_median"] for r in mine if r.get("step_s_median") is not None]
            ),
            "release_floor_s_median": _median(
                [r["release_floor_s_median"] for r in mine if r.get("release_floor_s_median") is not None]
            ),
        }
    if "sync" in out and "streaming" in out and out["streaming"]["last_verdict_s_median"] is not None:
        # a zero-staleness step cannot end before its own last verdict: the floor of streaming's
        # per-step ratio to sync, whatever its learner does
        out["streaming"]["last_verdict_over_sync_step"] = (
            out["streaming"]["last_verdict_s_median"] / out["sync"]["seconds_per_step_median"]
        )
        out["streaming"]["step_over_sync_step"] = (
            out["streaming"]["seconds_per_step_median"] / out["sync"]["seconds_per_step_median"]
        )
    sync_step = out.get("sync", {}).get("step_s_median")
    if "streaming" in out and sync_step:  # medians of per-step values, mode against mode
        stream = out["streaming"]
        if stream["step_s_median"] is not None:
            stream["step_median_over_sync_step"] = stream["step_s_median"] / sync_step
        if stream["release_floor_s_median"] is not None:
            stream["release_floor_over_sync_step"] = stream["release_floor_s_median"] / sync_step
    return out


def sync_rate(runs: list[dict], name: str) -> float | None:
    """The workload's sync learner seconds per token (median over its sync runs so far), or None."""
    rates = [
        r["learner_s_per_token_median"]
        for r in runs
        if r["workload"] == name and r["mode"] == "sync" and r.get("learner_s_per_token_median")
    ]
    return statistics.median(rates) if rates else None


def targets_met(summary: dict, name: str) -> dict[str, bool | None]:
    def value(mode: str) -> float | None:
        m = summary.get(mode)
        if m is None:
            return None
        return m["median_seconds"] if m["median_seconds"] is not None else math.inf

    def compare(stream: float | None, other: float | None, factor: float = 1.0) -> bool | None:
        """None: a mode missing, or neither median reached (nothing measured to compare)."""
        if stream is None or other is None or (math.isinf(stream) and math.isinf(other)):
            return None
        return stream <= factor * other

    stream = value("streaming")
    met = {f"streaming_le_{peer}": compare(stream, value(peer)) for peer in ("async", "async_is")}
    if name == "balanced":
        met["streaming_le_0.6x_sync"] = compare(stream, value("sync"), 0.6)
    return met


def plot(path: Path, runs: list[dict], workloads: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(workloads), figsize=(6 * len(workloads), 7), squeeze=False, dpi=100)
    for col, name in enumerate(workloads):
        for r in (r for r in runs if r["workload"] == name):
            rewards = r["rewards"]
            avg = [statistics.fmean(rewards[max(0, i - WINDOW + 1) : i + 1]) for i in range(len(rewards))]
            style = {"color": COLORS[r["mode"]], "linewidth": 0.9, "alpha": 0.8}
            label = r["mode"] if r["seed"] == min(x["seed"] for x in runs if x["mode"] == r["mode"]) else None
            axes[0][col].plot(range(1, len(avg) + 1), avg, label=label, **style)
            axes[1][col].plot(r["elapsed_s"], avg, **style)
        for row, xlabel in enumerate(("step", "seconds since the first step started")):
            ax = axes[row][col]
            ax.axhline(TARGET, color="k", linestyle="--", linewidth=0.8)
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{WINDOW}-step moving average of the reward")
        axes[0][col].set_title(f"{name}", fontsize=10)
        axes[0][col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)
    parser.add_argument("--seeds", type=int, nargs="+", default=None, help="(default 0 1 2; quick 0)")
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    parser.add_argument("--workloads", nargs="+", default=["toy", "balanced"], choices=["toy", "balanced"])
    parser.add_argument("--max-steps", type=int, default=None, help="budget per run (default 300; quick 20)")
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument(
        "--balanced-hidden", type=int, default=128, help="Qwen3 width of the balanced workload"
    )
    parser.add_argument(
        "--balanced-context-tokens", type=int, default=0, help="shared context tokens per prompt (balanced)"
    )
    parser.add_argument(
        "--balanced-groups", type=int, default=16, help="groups per step of the balanced workload"
    )
    parser.add_argument(
        "--balanced-latency-median-s",
        type=float,
        default=0.002,
        help="verdict latency median of the balanced workload (sync idles ~50%%)",
    )
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True)
    add_split_backward_arg(parser, " (streaming)")
    add_call_cap_args(parser)
    args = parser.parse_args(argv)
    args.seeds = args.seeds if args.seeds is not None else ([0] if args.quick else [0, 1, 2])
    args.max_steps = args.max_steps or (20 if args.quick else 300)
    torch.set_num_threads(args.threads)
    load_start = load_average()
    path = Path(args.out) / f"{NAME}.json"
    stored = json.loads(path.read_text()).get("runs", []) if args.resume and path.exists() else []
    runs: list[dict] = []

    def write() -> dict:
        results: dict[str, Any] = {
            "description": (
                "wall-clock and steps to a 10-step moving average reward of 0.9, per mode and workload"
            ),
            "target": TARGET,
            "window": WINDOW,
            "targets": TARGETS,
            "median_seconds": {},
            "median_steps": {},
            "workloads": {},
            "runs": runs,
            "quick": args.quick,
            "threads": args.threads,
            "load_average_start": load_start,
            "load_average_end": load_average(),
        }
        for name in args.workloads:
            summary = summarise([r for r in runs if r["workload"] == name])
            results["median_seconds"][name] = {m: s["median_seconds"] for m, s in summary.items()}
            results["median_steps"][name] = {m: s["median_steps"] for m, s in summary.items()}
            results["workloads"][name] = {"modes": summary, "targets_met": targets_met(summary, name)}
        write_result(args.out, NAME, results)
        return results

    for seed in args.seeds:  # seeds outermost: an interrupted run still has every mode for the first seeds
        for name in args.workloads:
            for mode in args.modes:
                done = next(
                    (
                        r
                        for r in stored
                        if (r["workload"], r["mode"], r["seed"]) == (name, mode, seed)
                        and r.get("settings") == settings(args, name, r["mode"])
                    ),
                    None,
                )
                if done is None:
                    print(f"{name} {mode} seed {seed}: running (budget {args.max_steps} steps)", flush=True)
                    done = run_one(args, name, mode, seed, None if mode == "sync" else sync_rate(runs, name))
                else:
                    print(f"{name} {mode} seed {seed}: already in {path}, skipped", flush=True)
                runs.append(done)
                print(
                    f"  reached {done['reached']} at step {done['steps']} ({done['seconds']} s); ran "
                    f"{done['steps_run']} steps in {done['seconds_run']:.1f} s (load {load_average()})",
                    flush=True,
                )
                write()
    results = write()
    plot(path.with_suffix(".png"), runs, args.workloads)
    for name in args.workloads:
        print(
            f"{name}: median seconds {results['median_seconds'][name]}, median steps "
            f"{results['median_steps'][name]}"
        )
        print(f"  targets met: {results['workloads'][name]['targets_met']}")
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return results


if __name__ == "__main__":
    main()
