"""Learner cost of a call that spans many destinations: separate calls, one call with a backward
per destination, and one split backward (the backward backend ``backends/split/``).

Workload: one streaming moment of B groups of G trajectories: group 0 fully rewarded (its rows
go to the step's gradient), groups 1-2 partly rewarded (rows with a known reward go to their
(group, reward) sum), the rest reward-pending (each row's gradient is held apart). That is
1 + buckets + pending destinations. Three ways to add the batch to ``StreamingGRPO``:

* ``separate``: what the runner did before the split: one call per destination (the direct rows
  together, each bucket, each pending row alone);
* ``per_job``: one call (one forward) and one ``autograd.grad`` per destination on its graph;
* ``split``: one call, one backward, the parameter gradients split by row; the sums and held
  gradients keep Linear/Embedding weight gradients as factors where smaller (``backends/split/factors.py``);
* ``split_dense``: the same with ``SplitBackend(factors=False)``: every destination's
  gradient formed at once (the split before the factors).

All four give the same gradient (relative difference printed). Three models: the toy policy of
the time-to-target benchmark (per-call overheads dominate), the balanced time-to-target
workload's Qwen3 (hidden 128, 0.53M parameters, short rows: where factors are smaller than the
gradients) and the short overlap workload's Qwen3 (hidden 256); ``--models large`` adds a ~0.18B Qwen3 (hidden
1024, 8 layers, vocab 32000, 256-token actions) for an accelerator: ``split_backward="auto"`` splits only up
to 1M trainable parameters because the 2.4M model lost on CPU, and whether larger models gain where small
calls cost kernel launches is what ``--device cuda`` measures (``benchmarks/gpu_check.sh`` runs it).
Reported: median seconds per way (wall and process CPU, interleaved repeats; on CUDA each way
ends with a device synchronise) and the ratios separate / split, per_job / split and
split_dense / split.

    python benchmarks/split_backward.py [--quick] [--out DIR] [--device cpu|cuda]
    [--models toy balanced short large]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import time_to_target  # noqa: E402
from _common import (  # noqa: E402
    add_common_args,
    add_score_forward_tokens_arg,
    median,
    timed_cpu,
    write_bar_chart,
    write_result,
)
from _harness import load_average, qwen3_config  # noqa: E402
from thundersync_lightning.backends.split import SplitBackend  # noqa: E402
from thundersync_lightning.core import StreamingGRPO  # noqa: E402
from thundersync_lightning.core.types import Segment, Trajectory  # noqa: E402
from thundersync_lightning.envs.toy import toy_model_spec  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy  # noqa: E402

MODELS = {
    "toy": (dict(toy_model_spec().config), 3, 9),  # (config, prompt tokens, mean action tokens)
    "balanced": (time_to_target.balanced_model(128), 2, 3),
    "short": (qwen3_config(256, 1024, 2, 1024), 16, 71),
    "large": (qwen3_config(1024, 4096, 8, 32000, max_positions=1024), 64, 256),
}
DEFAULT_MODELS = ("toy", "balanced", "short")  # "large" is for an accelerator (module docstring)
WAYS = ("separate", "per_job", "split", "split_dense")


def make_batch(groups: int, size: int, prompt: int, action: int, vocab: int) -> list[Trajectory]:
    rng = random.Random(0)
    out = []
    for g in range(groups):
        for k in range(size):
            n = max(2, action + rng.randint(-action // 2, action // 2))
            tokens = tuple(rng.randrange(vocab) for _ in range(n))
            out.append(
                Trajectory(
                    f"g{g}-t{k}",
                    f"g{g}",
                    k,
                    tuple(rng.randrange(vocab) for _ in range(prompt)),
                    (Segment(tokens, True),),
                    0,
                    1,
                    "stop",
                    0.0,
                    0.0,
                )  # fmt: skip
            )
    return out


def early_rewards(batch: list[Trajectory], size: int) -> list[str]:
    """Group 0 complete, groups 1 and 2 with half their rewards: direct rows, buckets, pending."""
    ids = [t.trajectory_id for t in batch]
    return ids[:size] + ids[size : size + size // 2] + ids[2 * size : 2 * size + size // 2]


def calls(batch: list[Trajectory], early: list[str], size: int) -> list[list[Trajectory]]:
    """The runner's calls without the split: direct rows, each (group, reward) bucket, each pending row."""
    rewards = {t: float(int(t.rsplit("t", 1)[1]) % 2) for t in early}
    direct = batch[:size]
    buckets: dict[tuple[str, float], list[Trajectory]] = {}
    lone = []
    for t in batch[size:]:
        if t.trajectory_id in rewards:
            buckets.setdefault((t.group_id, rewards[t.trajectory_id]), []).append(t)
        else:
            lone.append([t])
    return [direct, *buckets.values(), *lone]


def run(policy: GRPOPolicy, batch, early, size, way: str, backend: SplitBackend) -> tuple[torch.Tensor, int]:
    params = [p for p in policy.parameters() if p.requires_grad]
    split = way.startswith("split")
    backend.factors = way != "split_dense"
    acc = StreamingGRPO(params, objective=policy.objective, backend=backend if split else None)
    for g in sorted({t.group_id for t in batch}):
        acc.open_group(g, [t.trajectory_id for t in batch if t.group_id == g])
    reward = {t.trajectory_id: float(t.sample % 2) for t in batch}
    for tid in early:
        acc.add_reward(tid, reward[tid])
    for chunk in calls(batch, early, size) if way == "separate" else [batch]:
        watch = backend.capture if split else None
        scores = policy.score_tokens(chunk, watch=watch)
        acc.add_scored(chunk, scores, watch=watch)
    for t in batch:
        if t.trajectory_id not in early:
            acc.add_reward(t.trajectory_id, reward[t.trajectory_id])
    report = acc.finish()
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    if grad.is_cuda:  # the timer reads the host clock: every kernel of this way has to be done
        torch.cuda.synchronize(grad.device)
    return grad, report.backward_passes


def measure(
    name: str, groups: int, size: int, repeats: int, forward_tokens: int, device: str = "cpu"
) -> dict:
    config, prompt, action = MODELS[name]
    torch.manual_seed(0)
    policy = GRPOPolicy(config=config, score_forward_tokens=forward_tokens).to(device)
    batch = make_batch(groups, size, prompt, action, config["vocab_size"])
    early = early_rewards(batch, size)
    backend = SplitBackend(policy, [p for p in policy.parameters() if p.requires_grad], strict=True)
    grads, passes = {}, {}
    for way in WAYS:  # warm-up; the split's first call is its check against per-destination passes
        grads[way], passes[way] = run(policy, batch, early, size, way, backend)
    samples: dict[str, dict[str, list[float]]] = {w: {"wall": [], "cpu": []} for w in WAYS}
    for _ in range(repeats):
        for way in WAYS:  # interleaved: the same machine conditions for each way
            wall, cpu, _ = timed_cpu(lambda way=way: run(policy, batch, early, size, way, backend))
            samples[way]["wall"].append(wall)
            samples[way]["cpu"].append(cpu)
    medians = {w: {"wall_s": median(v["wall"]), "cpu_s": median(v["cpu"])} for w, v in samples.items()}
    rel = {
        w: float((grads[w] - grads["per_job"]).norm() / grads["per_job"].norm())
        for w in WAYS
        if w != "per_job"
    }
    return {
        "parameters": sum(p.numel() for p in policy.parameters()),
        "trajectories": len(batch),
        "destinations": len(calls(batch, early, size)),
        "backward_passes": passes,
        "seconds": medians,
        "samples": samples,
        "separate_over_split_wall": medians["separate"]["wall_s"] / medians["split"]["wall_s"],
        "separate_over_split_cpu": medians["separate"]["cpu_s"] / medians["split"]["cpu_s"],
        "per_job_over_split_wall": medians["per_job"]["wall_s"] / medians["split"]["wall_s"],
        "split_dense_over_split_wall": medians["split_dense"]["wall_s"] / medians["split"]["wall_s"],
        "split_dense_over_split_cpu": medians["split_dense"]["cpu_s"] / medians["split"]["cpu_s"],
        "gradient_rel_diff_vs_per_job": rel,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = add_common_args(argparse.ArgumentParser(description=__doc__), default_threads=1)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--models", nargs="+", default=list(DEFAULT_MODELS), choices=list(MODELS))
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    add_score_forward_tokens_arg(parser)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: this torch build or machine has no usable CUDA device")
    if args.quick:
        args.groups, args.group_size, args.repeats = 3, 4, 2
    torch.set_num_threads(args.threads)
    load_start = load_average()
    models = {
        name: measure(
            name, args.groups, args.group_size, args.repeats, args.score_forward_tokens, args.device
        )
        for name in args.models
    }
    payload = {
        "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "workload": {
            "groups": args.groups,
            "group_size": args.group_size,
            "repeats": args.repeats,
            "score_forward_tokens": args.score_forward_tokens,
        },  # fmt: skip
        "models": models,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    write_result(args.out, "split_backward", payload)
    write_bar_chart(
        Path(args.out) / "split_backward.png",
        {
            f"{name} {way}": {"wall s": m["seconds"][way]["wall_s"]}
            for name, m in models.items()
            for way in WAYS
        },
        ylabel="seconds to add one batch",
        title="one call spanning every destination: separate calls, a backward per destination, split",
    )
    for name, m in models.items():
        s = m["seconds"]
        print(
            f"{name}: {m['trajectories']} trajectories, {m['destinations']} destinations: separate "
            f"{s['separate']['wall_s'] * 1e3:.1f} ms, per-destination backward "
            f"{s['per_job']['wall_s'] * 1e3:.1f} ms, split {s['split']['wall_s'] * 1e3:.1f} ms (dense sums "
            f"{s['split_dense']['wall_s'] * 1e3:.1f} ms, {m['split_dense_over_split_wall']:.2f}x) -> "
            f"separate/split {m['separate_over_split_wall']:.2f}x (cpu {m['separate_over_split_cpu']:.2f}x); "
            f"gradient rel diff {m['gradient_rel_diff_vs_per_job']}"
        )
    return payload


if __name__ == "__main__":
    main()
