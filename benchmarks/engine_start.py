"""How long the embedded engine's generation process takes to start, by start method.

``EmbeddedEngineConfig(start_method="forkserver")`` (the default) forks each generation process
from multiprocessing's fork server, which imports torch, transformers, this package and the
model's code once per learner process; ``"spawn"`` starts a fresh interpreter every time. Each
method runs in a fresh learner process (``--child``), so the first start includes the fork
server's own start. Per method, wall seconds of ``EmbeddedEngineConfig.build`` (start to the
process's ``ready``): the first start, the median of ``--starts`` later ones, and a rollout right
after the process was SIGKILLed (its restart and replay) against one without a kill, on the toy
policy and the guessing game. Ratios spawn / forkserver (``spawn_over_forkserver``: above 1,
forkserver is faster).

    python benchmarks/engine_start.py [--quick] [--out DIR] [--starts 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_common_args, median, write_bar_chart, write_result  # noqa: E402
from _harness import load_average  # noqa: E402

NAME = "engine_start"
METHODS = ("forkserver", "spawn")


def measure(method: str, starts: int) -> dict:
    """In this (fresh) process: the first start, ``starts`` more, and a rollout across a kill."""
    from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec
    from thundersync_lightning.rollout import EmbeddedEngineConfig, build_model, make_request

    spec, tasks = toy_model_spec(), GuessingGameTasks(latency_median_s=0.0)
    config = EmbeddedEngineConfig(start_method=method, max_engine_restarts=1)
    times = []
    for _ in range(1 + starts):
        began = time.perf_counter()
        engine = config.build(spec, tasks)
        times.append(time.perf_counter() - began)
        engine.shutdown()
    engine = config.build(spec, tasks)
    try:
        engine.publish(build_model(spec).state_dict(), version=0)
        rollouts = []
        for step, kill in ((0, False), (1, False), (2, True)):
            request = make_request(tasks, step=step, num_groups=4, group_size=4, seed=0)
            began = time.perf_counter()
            if kill:
                os.kill(engine.pid, signal.SIGKILL)
            events = list(engine.rollout(request))
            rollouts.append(time.perf_counter() - began)
            assert len(events) == 2 * 16, "a rollout lost events"
    finally:
        engine.shutdown()
    return {
        "first_start_s": times[0],
        "later_start_s": times[1:],
        "later_start_s_median": median(times[1:]),
        "rollout_s": rollouts[1],
        "rollout_after_kill_s": rollouts[2],
        "restart_s": rollouts[2] - rollouts[1],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)
    parser.add_argument(
        "--starts", type=int, default=None, help="starts after the first (default 5; quick 2)"
    )
    parser.add_argument("--child", choices=METHODS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    starts = args.starts or (2 if args.quick else 5)
    if args.child:  # one method, in a fresh learner process: print its figures as JSON
        print(json.dumps(measure(args.child, starts)), flush=True)
        return {}
    load_start = load_average()
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    results: dict[str, dict] = {}
    for method in METHODS:
        out = subprocess.run(
            [sys.executable, __file__, "--child", method, "--starts", str(starts),
             "--threads", str(args.threads)],
            env=env, check=True, capture_output=True, text=True,
        )  # fmt: skip
        results[method] = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{method}: first start {results[method]['first_start_s']:.2f} s, later "
              f"{results[method]['later_start_s_median']:.3f} s, restart "
              f"{results[method]['restart_s']:.2f} s",
              flush=True)  # fmt: skip
    fork, spawn = results["forkserver"], results["spawn"]
    ratios = {
        "first_start": spawn["first_start_s"] / fork["first_start_s"],
        "later_start": spawn["later_start_s_median"] / fork["later_start_s_median"],
        "restart": spawn["restart_s"] / max(fork["restart_s"], 1e-9),
    }
    payload = {
        "description": "embedded engine start-up seconds by start method (fresh learner process per method)",
        "starts_after_the_first": starts,
        "threads": args.threads,
        "methods": results,
        "spawn_over_forkserver": ratios,
        "load_average_start": load_start,
        "load_average_end": load_average(),
    }
    path = write_result(args.out, NAME, payload)
    write_bar_chart(
        Path(args.out) / f"{NAME}.png",
        {
            "first start": {m: results[m]["first_start_s"] for m in METHODS},
            "later start (median)": {m: results[m]["later_start_s_median"] for m in METHODS},
            "restart after SIGKILL": {m: results[m]["restart_s"] for m in METHODS},
        },
        ylabel="seconds",
        title="embedded engine: generation process start-up by start method",
    )
    print("spawn / forkserver: " + ", ".join(f"{k} {v:.1f}x" for k, v in ratios.items()))
    print(f"wrote {path} and {path.with_suffix('.png')}")
    return payload


if __name__ == "__main__":
    main()
