"""Learner cost of one call by how it is cut into forwards: ``GRPOPolicy(score_forward_tokens=...)``.

A call of n trajectories is scored in length-sorted micro-batches (``modules/micro_batches.py``).
With ``score_forward_tokens=0`` a micro-batch's padding stays within ``score_max_padding`` (0.25)
of its real tokens; with f > 0 (the default 64) it may also carry up to f padded tokens, the fixed
cost of one more forward. Workload: the guessing game's trajectory lengths (a 1-token prompt and two
tokens per turn, 1-4 turns: 3-9 tokens) on the toy policy, a direct call (every reward known:
one destination, like the synchronous learner's and streaming's direct calls) of n trajectories
through ``score_tokens`` and ``StreamingGRPO.add_tokens``. Interleaved repeats, medians of wall
and process CPU seconds per call, the forwards each setting ran, and the ratios to 0
(``wall_0_over[f]``, ``cpu_0_over[f]``: above 1, the setting is faster).

    python benchmarks/micro_batches.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_common_args, median, timed_cpu, write_bar_chart, write_result  # noqa: E402
from _harness import direct_accumulator, load_average  # noqa: E402
from thundersync_lightning.core.types import Segment, Trajectory  # noqa: E402
from thundersync_lightning.envs.toy import toy_model_spec  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy  # noqa: E402

SETTINGS = (0, 16, 32, 64)  # score_forward_tokens


def game_batch(n: int, seed: int) -> list[Trajectory]:
    """n trajectories shaped like the guessing game's: START, then (guess, answer) per turn."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        segments = []
        for _ in range(rng.randint(1, 4)):
            segments += [Segment((rng.randrange(8),), True), Segment((8 + rng.randrange(4),), False)]
        out.append(
            Trajectory(
                f"g{i // 8}-t{i % 8}", f"g{i // 8}", i % 8, (12,), tuple(segments), 0, 1, "stop", 0.0, 0.0
            )
        )
    return out


def one_call(policy: GRPOPolicy, batch: list[Trajectory]) -> int:
    """Score and add one direct call; returns the forwards it ran."""
    acc = direct_accumulator(policy, batch)
    forwards = []
    hook = policy.model.register_forward_hook(lambda *_: forwards.append(1))
    try:
        scores = policy.score_tokens(batch)
    finally:
        hook.remove()
    acc.add_scored(batch, scores)
    return len(forwards)


def measure(sizes: list[int], repeats: int) -> dict:
    torch.manual_seed(0)
    policies = {f: GRPOPolicy(config=dict(toy_model_spec().config), score_forward_tokens=f) for f in SETTINGS}
    for f in SETTINGS[1:]:
        policies[f].load_state_dict(policies[SETTINGS[0]].state_dict())
    out = {}
    for n in sizes:
        samples: dict[int, dict[str, list[float]]] = {f: {"wall": [], "cpu": []} for f in SETTINGS}
        forwards: dict[int, list[int]] = {f: [] for f in SETTINGS}
        for rep in range(repeats + 1):  # the first round warms up
            batch = game_batch(n, seed=rep)
            for f in SETTINGS:  # interleaved: the same batch and machine conditions for both
                wall, cpu, k = timed_cpu(lambda f=f, batch=batch: one_call(policies[f], batch))
                if rep:
                    samples[f]["wall"].append(wall)
                    samples[f]["cpu"].append(cpu)
                    forwards[f].append(k)
        seconds = {
            str(f): {"wall_s": median(s["wall"]), "cpu_s": median(s["cpu"])} for f, s in samples.items()
        }
        out[str(n)] = {
            "seconds": seconds,
            "forwards_median": {str(f): median(k) for f, k in forwards.items()},
            "samples": {str(f): s for f, s in samples.items()},
            "wall_0_over": {str(f): seconds["0"]["wall_s"] / seconds[str(f)]["wall_s"] for f in SETTINGS[1:]},
            "cpu_0_over": {str(f): seconds["0"]["cpu_s"] / seconds[str(f)]["cpu_s"] for f in SETTINGS[1:]},
        }
    return out


def main(argv: list[str] | None = None) -> dict:
    parser = add_common_args(argparse.ArgumentParser(description=__doc__), default_threads=1)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32, 96])
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.repeats = [4, 32], 3
    torch.set_num_threads(args.threads)
    load_start = load_average()
    calls = measure(args.sizes, args.repeats)
    payload = {
        "workload": {"sizes": args.sizes, "repeats": args.repeats, "settings": list(SETTINGS)},
        "calls": calls,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    write_result(args.out, "micro_batches", payload)
    write_bar_chart(
        Path(args.out) / "micro_batches.png",
        {f"{n} rows": {f"score_forward_tokens={f}": c["seconds"][str(f)]["wall_s"] * 1e3 for f in SETTINGS}
         for n, c in calls.items()},
        ylabel="ms per direct call (score + add_tokens)",
        title=(
            "the toy game's trajectories: cut by padding alone (0) or with a "
            "forward's fixed cost (f tokens)"
        ),
    )  # fmt: skip
    for n, c in calls.items():
        s, k = c["seconds"], c["forwards_median"]
        cells = [f"{f} -> {s[str(f)]['wall_s'] * 1e3:.2f} ms ({k[str(f)]:g} fwd)" for f in SETTINGS]
        ratios = ", ".join(f"{f}: {c['wall_0_over'][str(f)]:.2f}x" for f in SETTINGS[1:])
        print(f"{n:>3} rows: {'; '.join(cells)}; 0 over {ratios}")
    return payload


if __name__ == "__main__":
    main()
