"""Learner work per step with and without the boundary cut on prompt-heavy agent trajectories.

Workload: B groups of G = 8 trajectories; each group shares a prompt of P tokens (the task and
repository context) followed by an agent episode of A scored-and-observed tokens with P >= 2A,
as for coding agents. A randomly initialised Qwen3 on CPU. One step processes every trajectory
of the batch through ``StreamingGRPO`` in a streaming order (content then reward per group,
interleaved across groups): once with whole trajectories (each runs the prompt forward and
backward again), once with ``GRPOPolicy.encode_prefix`` (the prompt forward once per group and
its backward once at the group's close). Both give the same gradient (checked, relative
difference printed). Reported: median learner seconds per step (wall and process CPU), the ratio
uncut / cut (target >= 1.5), learner tokens, and the implied step time in the overlap setting:
with a learner-bound step (the learner idles little), step time scales with learner work.

    python benchmarks/boundary_cut.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_common_args, median, timed_cpu, write_bar_chart, write_result  # noqa: E402
from _harness import load_average, qwen3_config  # noqa: E402
from thundersync_lightning.core import Objective, StreamingGRPO  # noqa: E402
from thundersync_lightning.core.types import Segment, Trajectory  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy  # noqa: E402


def make_batch(groups: int, size: int, prompt: int, action: int, vocab: int, seed: int):
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        p = tuple(rng.randrange(vocab) for _ in range(prompt))
        members = []
        for k in range(size):
            half = action // 2
            segs = (
                Segment(tuple(rng.randrange(vocab) for _ in range(half)), True),
                Segment(tuple(rng.randrange(vocab) for _ in range(action - 2 * half)), False),
                Segment(tuple(rng.randrange(vocab) for _ in range(half)), True),
            )
            segs = tuple(s for s in segs if s.tokens)
            members.append(Trajectory(f"g{g}-t{k}", f"g{g}", k, p, segs, 0, 2, "submit", 0.0, 0.0))
        out.append(members)
    return out


def run_step(policy: GRPOPolicy, batch, rewards, cut: bool) -> tuple[torch.Tensor, int]:
    params = [p for p in policy.parameters() if p.requires_grad]
    acc = StreamingGRPO(params, objective=policy.objective)
    for members in batch:
        acc.open_group(members[0].group_id, [t.trajectory_id for t in members])
    tokens = 0
    prefixes = {}
    order = [
        t for k in range(len(batch[0])) for members in batch for t in [members[k]]
    ]  # interleaved arrival
    for t in order:
        prefix = None
        if cut:
            prefix = prefixes.get(t.group_id)
            if prefix is None:
                prefix = prefixes[t.group_id] = policy.encode_prefix(t.prompt)
                tokens += len(t.prompt)
        extra = {"prefix": prefix} if cut else {}
        scores = policy.score_tokens([t], **extra)
        acc.add_scored([t], scores, prefix=prefix)
        acc.add_reward(t.trajectory_id, rewards[t.trajectory_id])
        tokens += len(t.tokens) - (len(t.prompt) if cut else 0)
    acc.finish()
    grad = torch.cat([p.grad.reshape(-1) for p in params])
    for p in params:
        p.grad = None
    return grad, tokens


def main(argv: list[str] | None = None) -> dict:
    parser = add_common_args(argparse.ArgumentParser(description=__doc__), default_threads=2)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=384)
    parser.add_argument("--action", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    if args.quick:
        args.groups, args.prompt, args.action, args.hidden, args.layers, args.repeats = 2, 192, 64, 128, 2, 2
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = qwen3_config(
        args.hidden, 4 * args.hidden, args.layers, args.vocab, args.prompt + args.action + 8
    )
    policy = GRPOPolicy(config=config, objective=Objective())
    policy.eval()
    batch = make_batch(args.groups, args.group_size, args.prompt, args.action, args.vocab, seed=1)
    rewards = {t.trajectory_id: float(t.sample % 2) for m in batch for t in m}  # no all-equal group
    load_start = load_average()
    results: dict[str, dict] = {"uncut": {"wall": [], "cpu": []}, "cut": {"wall": [], "cpu": []}}
    grads, tokens = {}, {}
    run_step(policy, batch, rewards, cut=True)  # warm-up (allocator, kernels)
    for _ in range(args.repeats):
        for name, cut in (("uncut", False), ("cut", True)):  # interleaved: same machine conditions
            wall, cpu, (grad, n) = timed_cpu(lambda cut=cut: run_step(policy, batch, rewards, cut))
            results[name]["wall"].append(wall)
            results[name]["cpu"].append(cpu)
            grads[name], tokens[name] = grad, n
    rel = float((grads["cut"] - grads["uncut"]).norm() / grads["uncut"].norm())
    medians = {k: {"wall_s": median(v["wall"]), "cpu_s": median(v["cpu"])} for k, v in results.items()}
    ratio_wall = medians["uncut"]["wall_s"] / medians["cut"]["wall_s"]
    ratio_cpu = medians["uncut"]["cpu_s"] / medians["cut"]["cpu_s"]
    payload = {
        "workload": {
            "groups": args.groups,
            "group_size": args.group_size,
            "prompt_tokens": args.prompt,
            "action_tokens": args.action,
            "parameters": sum(p.numel() for p in policy.parameters()),
        },
        "learner_seconds": medians,
        "samples": results,
        "learner_work_ratio_wall": ratio_wall,
        "learner_work_ratio_cpu": ratio_cpu,
        "learner_tokens": tokens,
        "gradient_rel_diff": rel,
        "target_ratio": 1.5,
        "target_met": min(ratio_wall, ratio_cpu) >= 1.5,
        "overlap_step_time_ratio_learner_bound": ratio_cpu,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    write_result(args.out, "boundary_cut", payload)
    write_bar_chart(
        Path(args.out) / "boundary_cut.png",
        {
            k: {"wall s": v["wall_s"], "cpu s / threads": v["cpu_s"] / args.threads}
            for k, v in medians.items()
        },
        ylabel="learner seconds per step",
        title=(
            f"boundary cut: {ratio_wall:.2f}x less learner wall time "
            f"({ratio_cpu:.2f}x CPU), grad rel diff {rel:.1e}"
        ),
    )
    print(
        f"learner per step: uncut {medians['uncut']['wall_s']:.2f}s, cut {medians['cut']['wall_s']:.2f}s "
        f"-> {ratio_wall:.2f}x (cpu {ratio_cpu:.2f}x); tokens {tokens}; gradient rel diff {rel:.2e}"
    )
    return payload


if __name__ == "__main__":
    main()
