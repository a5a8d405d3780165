"""``verify`` (:mod:`thundersync_lightning.verify`) over seeds, precisions and LoRA: the measurement
behind the bf16 tolerance, and the GPU check's first section.

Per (model, precision, lora, seed): one sync step on the engine, its rollouts recorded, and one
streaming step on their replay, from the same weights; the relative gradient difference (whole and
worst parameter) and the engine-vs-learner KL. Models:

    toy    the guessing game's tiny Qwen3 with the embedded engine (real sampling, engine logprobs)
    0.6B   a randomly initialised Qwen3-0.6B shape with the trace-replay engine (seeded tokens and
           Bernoulli rewards: a random 0.6B model earns no game rewards; no engine logprobs, so no KL)
    tiny   a tiny Qwen3 with the trace-replay engine (the 0.6B path in seconds: ``--dry-run``)

    python benchmarks/verify_check.py --models toy --precisions 32-true bf16-true --lora both \\
        --seeds 0 1 2 3 4 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _common import write_result  # noqa: E402
from _harness import qwen3_config  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.modules.lora import LoraSettings  # noqa: E402
from thundersync_lightning.modules.shape import QWEN3_ARCHITECTURES  # noqa: E402
from thundersync_lightning.rollout import EmbeddedEngineConfig, TraceReplayEngineConfig  # noqa: E402
from thundersync_lightning.strategy import ThunderSyncStrategy  # noqa: E402
from thundersync_lightning.verify import TOLERANCES, VerifyError, precision_of, verify_step  # noqa: E402

NAME = "verify"
MODELS = ("toy", "0.6B", "tiny")


def model_config(name: str) -> dict[str, Any]:
    if name == "toy":
        return dict(toy_model_spec().config)
    if name == "tiny":
        return qwen3_config(64, 128, 2, 256)
    return dict(QWEN3_ARCHITECTURES[f"Qwen3-{name}"])


def engine(name: str, device: str, token_scale: float) -> Any:
    if name == "toy":
        return EmbeddedEngineConfig(num_threads=1, env_workers=16, device=device)
    return TraceReplayEngineConfig(time_scale_s=1e-3, token_scale=token_scale)


def run_one(model: str, precision: str, lora: bool, seed: int, args: argparse.Namespace) -> dict[str, Any]:
    torch.manual_seed(seed)
    policy = GRPOPolicy(
        config=model_config(model),
        lora=LoraSettings(r=8, alpha=16) if lora else None,
        lr=1e-6,
    )
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency_median_s=0.003),
        engine=engine(model, args.engine_device, args.token_scale),
        group_size=args.group_size,
        groups_per_step=args.groups,
        seed=seed,
    )
    start = time.perf_counter()
    try:
        report = verify_step(
            policy, data, lambda mode: ThunderSyncStrategy(mode=mode), accelerator=args.accelerator,
            precision=precision, seed=seed,
        )  # fmt: skip
    except VerifyError as exc:
        return {"model": model, "precision": precision, "lora": lora, "seed": seed, "inconclusive": str(exc)}
    d = report.difference
    return {
        "model": model,
        "precision": precision,
        "lora": lora,
        "seed": seed,
        "trainable_parameters": sum(p.numel() for p in policy.parameters() if p.requires_grad),
        "trajectories": report.trajectories,
        "scored_tokens": report.scored_tokens,
        "relative_difference": d.relative,
        "worst_parameter": d.worst_parameter,
        "worst_relative_difference": d.worst_relative,
        "engine_learner_kl": report.engine_learner_kl,
        "streaming_held": report.streaming_held,
        "tolerance": report.tolerance,
        "passed": report.passed,
        "seconds": time.perf_counter() - start,
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per precision: the largest whole difference measured, against its tolerance."""
    out: dict[str, Any] = {}
    for run in runs:
        if "relative_difference" not in run:
            continue
        kind = precision_of(run["precision"], None)
        row = out.setdefault(kind, {"max_relative_difference": 0.0, "runs": 0, "tolerance": TOLERANCES[kind]})
        row["max_relative_difference"] = max(row["max_relative_difference"], run["relative_difference"])
        row["runs"] += 1
    for row in out.values():
        row["max_over_tolerance"] = row["max_relative_difference"] / row["tolerance"]
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["toy"], choices=MODELS)
    parser.add_argument("--precisions", nargs="+", default=["32-true", "bf16-true"])
    parser.add_argument("--lora", choices=["off", "on", "both"], default="off")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument(
        "--token-scale", type=float, default=1.0, help="trace rows' length multiplier (0.6B, tiny)"
    )
    parser.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"])
    parser.add_argument("--engine-device", default="cpu", help="the embedded engine's device (toy)")
    parser.add_argument("--out", default="runs/verify")
    args = parser.parse_args(argv)
    loras = {"off": [False], "on": [True], "both": [False, True]}[args.lora]
    runs: list[dict[str, Any]] = []
    for model in args.models:
        for precision in args.precisions:
            for lora in loras:
                for seed in args.seeds:
                    runs.append(run_one(model, precision, lora, seed, args))
                    r = runs[-1]
                    print(
                        f"{model} {precision} lora={lora} seed={seed}: "
                        + (f"inconclusive: {r['inconclusive']}" if "inconclusive" in r else
                           f"difference {r['relative_difference']:.2e} (worst "
                           f"{r['worst_relative_difference']:.2e} {r['worst_parameter']}), KL "
                           f"{r['engine_learner_kl']}, {'PASS' if r['passed'] else 'FAIL'}"),
                        flush=True,
                    )  # fmt: skip
                    write_result(args.out, NAME, {"runs": runs, "summary": summarize(runs)})
    payload = {"runs": runs, "summary": summarize(runs)}
    write_result(args.out, NAME, payload)
    return payload


if __name__ == "__main__":
    result = main()
    sys.exit(0 if all(r.get("passed", False) for r in result["runs"]) else 1)
