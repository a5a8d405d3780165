"""``overlap.py``'s set-up: the policy, the trace-replay engine and data, and the calibration of
the learner's cost per trajectory (single and synchronous) on the batches the runs will measure."""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Any

import torch

from _common import add_call_cap_args, add_common_args, add_score_forward_tokens_arg, add_split_backward_arg
from _harness import qwen3_config
from _workloads import WORKLOADS
from thundersync_lightning.core.accumulator.streaming import StreamingGRPO
from thundersync_lightning.core.types import ContentReady, GroupRequest, RewardReady, RolloutRequest
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.modules.shape import QWEN3_ARCHITECTURES
from thundersync_lightning.planning.memory_plan import FIXED_BATCH_TRAJECTORIES
from thundersync_lightning.rollout import TraceReplayEngineConfig
from thundersync_lightning.rollout.replay import TraceReplayEngine
from thundersync_lightning.strategy.batching import call_size

__all__ = [
    "parse_args",
    "make_policy",
    "model_config",
    "learner_dtype",
    "engine_config",
    "make_data",
    "calibrate",
    "sync_device",
    "workload_record",
]


def make_policy(args: argparse.Namespace) -> GRPOPolicy:
    torch.manual_seed(0)
    return GRPOPolicy(
        config=model_config(args), lr=1e-5, score_max_padding=args.score_max_padding,
        score_forward_tokens=args.score_forward_tokens,
    )  # fmt: skip


def model_config(args: argparse.Namespace) -> dict:
    if args.model:  # a published Qwen3 shape (the paper workload)
        return dict(QWEN3_ARCHITECTURES[f"Qwen3-{args.model}"])
    return qwen3_config(args.hidden, args.intermediate, args.layers, args.vocab, args.max_positions)


def learner_dtype(args: argparse.Namespace) -> torch.dtype:
    """The weights' dtype under ``--precision`` (Lightning's ``*-true`` casts the module)."""
    return {"bf16-true": torch.bfloat16, "16-true": torch.float16}.get(args.precision, torch.float32)


def engine_config(
    args: argparse.Namespace, time_scale_s: float, slots: int | None
) -> TraceReplayEngineConfig:
    return TraceReplayEngineConfig(
        trace=args.trace,
        time_scale_s=time_scale_s,
        prompt_tokens=args.prompt_tokens,
        rollout_slots=slots,
        token_scale=args.token_scale,
        setup_fraction=args.setup_fraction,
        turns=args.turns,
        observation_tokens=args.observation_tokens,
    )


def make_data(args: argparse.Namespace, time_scale_s: float, seed: int) -> RolloutDataModule:
    return RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),  # payloads only; the replay engine draws the tokens
        engine=engine_config(args, time_scale_s, args.rollout_slots or None),
        group_size=args.group_size,
        groups_per_step=args.groups,
        seed=seed,
    )


def calibrate(
    args: argparse.Namespace, device: torch.device, workloads: list[tuple[int, int]]
) -> dict[str, Any]:
    """Seconds of the learner's backward per trajectory, streaming-single and sync-batched, on the
    real trajectories of the (seed, step) batches the runs will measure (the engine draws them; no
    waiting: time scale ~0). The sync cost depends on each call's longest trajectory (padding), so
    it is averaged over the batches: total seconds / total trajectories."""
    policy = make_policy(args).to(device, learner_dtype(args))
    params = [p for p in policy.parameters() if p.requires_grad]
    batches = []
    for seed, step in workloads:
        engine = TraceReplayEngine(
            policy.model_spec, replace(engine_config(args, 1e-9, None), setup_fraction=0.0)
        )
        engine.publish({}, 0)
        request = RolloutRequest(
            step=step,
            groups=tuple(GroupRequest(f"s{step}-g{g}", g, None, args.group_size) for g in range(args.groups)),
            seed=seed,
        )
        events = list(engine.rollout(request))
        trajectories = [e.trajectory for e in events if isinstance(e, ContentReady)]
        rewards = {e.trajectory_id: e.reward for e in events if isinstance(e, RewardReady)}
        batches.append((trajectories, [rewards[t.trajectory_id] for t in trajectories]))

    def calls_of(trajectories: list, rewards: list) -> list[tuple[list, list]]:
        """The fit's calls, cut by ``max_batch_trajectories`` and ``max_batch_tokens`` as its
        learner cuts them (one call of a 16 x 8 long batch would hold every activation at once: 20+ GB)."""
        out, k = [], 0
        # "auto" is resolved by the fit from its memory plan; calibrated at its floor (the former default)
        rows = (
            FIXED_BATCH_TRAJECTORIES if args.max_batch_trajectories == "auto" else args.max_batch_trajectories
        )
        while k < len(trajectories):
            lengths = [len(t.tokens) for t in trajectories[k:]]
            n = call_size(lengths, rows, args.max_batch_tokens)
            out.append((trajectories[k : k + n], rewards[k : k + n]))
            k += n
        return out

    def sync_once(trajectories: list, rewards: list) -> float:
        for p in params:
            p.grad = None
        start = time.perf_counter()
        for call, call_rewards in calls_of(trajectories, rewards):
            policy.grpo_loss(call, call_rewards).backward()
        sync_device(device)
        return time.perf_counter() - start

    def single_once(t: Any) -> float:
        acc = StreamingGRPO(params)
        acc.open_group("g", [t.trajectory_id, "other"])
        start = time.perf_counter()
        acc.add_logprobs([t.trajectory_id], policy.trajectory_logprobs([t]))  # reward unknown: held
        sync_device(device)
        return time.perf_counter() - start

    per_batch = max(1, args.calibration_samples // len(batches))
    samples = [
        t
        for trajectories, _ in batches
        for t in trajectories[:: max(1, len(trajectories) // per_batch)][:per_batch]
    ]
    for t in samples[:2]:
        single_once(t)  # warm-up
    sync_once(*batches[0])
    singles: list[float] = []
    sync_seconds = [0.0] * len(batches)
    for _rep in range(args.calibration_reps):  # interleaved: the sync batches, then the singles
        for i, batch in enumerate(batches):
            sync_seconds[i] += sync_once(*batch)
        singles.extend(single_once(t) for t in samples)
    for p in params:
        p.grad = None
    n = sum(len(b[0]) for b in batches)
    lengths = [len(t.tokens) for b in batches for t in b[0]]
    calls = [c for b in batches for c, _ in calls_of(b[0], b[1])]
    padded = sum(len(c) * max(len(t.tokens) for t in c) for c in calls)  # before score_max_padding
    return {
        "workloads": [list(w) for w in workloads],
        "single_s": statistics.median(singles),
        "single_samples_s": singles,
        "sync_per_trajectory_s": sum(sync_seconds) / (n * args.calibration_reps),
        "sync_per_trajectory_by_batch_s": [
            x / (len(b[0]) * args.calibration_reps) for x, b in zip(sync_seconds, batches)
        ],
        "trajectories": n,
        "tokens_mean": statistics.mean(lengths),
        "tokens_min": min(lengths),
        "tokens_max": max(lengths),
        "sync_work_per_step_s": sum(sync_seconds) / (len(batches) * args.calibration_reps),
        "padding_factor_sync": padded / sum(lengths),
        "sample_mean_tokens": statistics.mean(len(t.tokens) for t in samples),
    }


def sync_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def parse_args(argv: list[str] | None, description: str, name: str = "overlap") -> argparse.Namespace:
    """``overlap.py``'s options, with the workload's defaults filled in (``--quick`` included)."""
    parser = argparse.ArgumentParser(description=description)
    add_common_args(parser, default_threads=1)  # 2 OpenMP threads stall on a shared 2-core VM (README)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument(
        "--workload",
        default="short",
        choices=sorted(WORKLOADS),
        help="model and trajectory shape (_workloads.py)",
    )
    parser.add_argument("--name", default=None, help="output name (default overlap; overlap_long for long)")
    parser.add_argument(
        "--rounds", type=int, default=None, help="interleaved rounds (default 4, quick 2; long quick 1)"
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="steps per block (default 5, quick 4; long quick 3)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured steps at the start of every block")
    parser.add_argument(
        "--groups", type=int, default=None, help="B, groups per step (default 16; long quick 4)"
    )
    parser.add_argument("--group-size", type=int, default=None, help="G (default 8; long quick 2)")
    parser.add_argument("--hidden", type=int, default=None, help="Qwen3 hidden size (workload's)")
    parser.add_argument("--intermediate", type=int, default=None, help="(workload's)")
    parser.add_argument("--layers", type=int, default=None, help="(workload's)")
    parser.add_argument("--vocab", type=int, default=None, help="(workload's)")
    parser.add_argument("--trace", default="paper_tail")
    parser.add_argument(
        "--prompt-tokens", type=int, default=None, help="unscored prompt tokens per trajectory (workload's)"
    )
    parser.add_argument(
        "--token-scale", type=float, default=None, help="x the trace's scored tokens (workload's)"
    )
    parser.add_argument(
        "--setup-fraction",
        type=float,
        default=0.0,
        help="environment set-up, x each trajectory's generation time",
    )
    parser.add_argument(
        "--prepare-ahead",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="ThunderSyncStrategy(prepare_ahead=...): set-up of step k+1 during step k",
    )
    add_split_backward_arg(parser)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rollout-slots",
        type=int,
        default=None,
        help="trajectories the rollout fleet runs at once (default B*G: a saturated fleet, as in the "
        "paper; 0: unlimited, which lets async start a whole batch early)",
    )
    parser.add_argument(
        "--calibrate",
        choices=["sync", "single", "balance"],
        default=None,
        help="what one trace unit is (short: sync, long: balance = sync idle 49.5%% at this batch)",
    )
    parser.add_argument(
        "--time-scale", type=float, default=None, help="seconds per trace unit (skips --calibrate)"
    )
    parser.add_argument(
        "--calibration-samples",
        type=int,
        default=None,
        help="single-trajectory timings per rep (12; long quick 4)",
    )
    parser.add_argument(
        "--calibration-batches", type=int, default=4, help="measured batches timed the sync way"
    )
    parser.add_argument(
        "--calibration-reps", type=int, default=None, help="(default 3, quick 2; long quick 1)"
    )
    add_call_cap_args(parser)
    parser.add_argument(
        "--score-max-padding", type=float, default=0.25, help="GRPOPolicy option (inf: the budget alone cuts)"
    )
    add_score_forward_tokens_arg(parser)
    parser.add_argument(
        "--max-open-groups", type=int, default=None, help="ThunderSyncStrategy option (GPU memory)"
    )
    parser.add_argument(
        "--offload", default="none", choices=["none", "cpu", "pinned"], help="ThunderSyncStrategy option"
    )
    parser.add_argument(
        "--peak-flops", type=float, default=None, help="peak FLOP/s for MFU (default: measured)"
    )
    parser.add_argument(
        "--model",
        default=None,
        choices=["0.6B", "1.7B", "none"],
        help="a published Qwen3 shape (workload's; none: --hidden etc.)",
    )
    parser.add_argument(
        "--precision", default=None, help="Lightning precision (workload's: 32-true, paper bf16-true)"
    )
    parser.add_argument("--max-held-trajectories", type=int, default=None, help="ThunderSyncStrategy option")
    parser.add_argument("--turns", type=int, default=None, help="scored turns per trajectory (workload's)")
    args = parser.parse_args(argv)
    q = args.quick
    w = WORKLOADS[args.workload]
    args.name = args.name or (name if args.workload == "short" else f"{name}_{args.workload}")
    args.rounds = args.rounds or (w.quick_rounds if q else 4)
    args.steps = args.steps or (w.quick_steps if q else 5)
    args.hidden_given, args.layers_given, args.vocab_given = args.hidden, args.layers, args.vocab
    args.groups = args.groups or ((w.quick_groups or w.groups) if q else w.groups)
    args.group_size = args.group_size or ((w.quick_group_size or w.group_size) if q else w.group_size)
    args.hidden = args.hidden or ((w.quick_hidden or w.hidden) if q else w.hidden)
    args.intermediate = args.intermediate or (w.intermediate * args.hidden // w.hidden)
    args.vocab = args.vocab or ((w.quick_vocab or w.vocab) if q else w.vocab)
    args.layers = args.layers or w.layers
    args.prompt_tokens = args.prompt_tokens or w.prompt_tokens
    args.token_scale = args.token_scale or w.token_scale
    args.max_positions = w.max_positions
    explicit_shape = any(v is not None for v in (args.hidden_given, args.layers_given, args.vocab_given))
    args.model = (
        None if args.model == "none" or (args.model is None and explicit_shape) else (args.model or w.model)
    )
    args.precision = args.precision or w.precision
    args.turns = args.turns or w.turns
    args.observation_tokens = w.observation_tokens
    args.max_batch_tokens = args.max_batch_tokens if args.max_batch_tokens is not None else w.max_batch_tokens
    args.max_open_groups = args.max_open_groups if args.max_open_groups is not None else w.max_open_groups
    if args.max_held_trajectories is None:
        args.max_held_trajectories = w.max_held_trajectories
    args.calibrate = args.calibrate or w.calibrate
    if args.rollout_slots is None:
        args.rollout_slots = args.groups * args.group_size
    args.calibration_reps = args.calibration_reps or (w.quick_calibration_reps if q else 3)
    args.calibration_samples = args.calibration_samples or (w.quick_calibration_samples if q else 12)
    if args.steps <= args.warmup:
        parser.error(f"--steps ({args.steps}) must exceed --warmup ({args.warmup})")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch.cuda.is_available() is False on this machine")
    return args


def workload_record(args: argparse.Namespace, cal: dict[str, Any], order_log: list) -> dict[str, Any]:
    """The run's workload as its JSON states it (the lengths measured by the calibration)."""
    return {
        "trace": args.trace,
        "prompt_tokens": args.prompt_tokens,
        "token_scale": args.token_scale,
        "trajectory_tokens_min_mean_max": [cal["tokens_min"], cal["tokens_mean"], cal["tokens_max"]],
        "setup_fraction": args.setup_fraction,
        "prepare_ahead": args.prepare_ahead,
        "split_backward": args.split_backward,
        "sync_idle_fraction_target": 0.495,
        "groups": args.groups,
        "group_size": args.group_size,
        "seeds": [args.seed + r for r in range(args.rounds)],
        "rounds": args.rounds,
        "steps_per_block": args.steps,
        "warmup_steps": args.warmup,
        "order": order_log,
        "max_batch_trajectories": args.max_batch_trajectories,
        "max_batch_tokens": args.max_batch_tokens,
        "min_batch_trajectories": args.min_batch_trajectories,
        "score_max_padding": args.score_max_padding,
        "score_forward_tokens": args.score_forward_tokens,
        "max_open_groups": args.max_open_groups,
        "max_held_trajectories": args.max_held_trajectories,
        "precision": args.precision,
        "turns": args.turns,
        "observation_tokens": args.observation_tokens,
        "offload": args.offload,
        "device": args.device,
    }
