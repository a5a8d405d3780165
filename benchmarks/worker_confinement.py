"""What confinement costs a user's tool call and reward: plain worker processes (rlimits only, the
engine's uid) against confined ones (bubblewrap, a uid of their own; envs/tools/confine.py).

Per mode, interleaved rounds of:

- ``tool_call``: one call of a trivial tool (``add``) on a running worker: the pipe round trip
  that every call after an episode's first costs (median of ``--calls``);
- ``reward``: one ``call_reward`` of a trivial user reward on a running reward worker (median of
  ``--calls``);
- ``start``: an episode's first tool call: the worker's start-up (sandbox set-up, interpreter,
  the user's module imported) and the call (median of ``--starts`` fresh pools).

Medians in seconds per mode, and the ratios confined / plain. Needs bubblewrap and root (as the
confined workers do).

    python benchmarks/worker_confinement.py [--quick] [--out DIR] [--calls N] [--starts N]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _common import add_common_args, median, write_result  # noqa: E402

NAME = "worker_confinement"
MODES = ("plain", "confined")

USER_MODULE = """
def add(a: int, b: int) -> int:
    return a + b


def score(prompt, completion, **row):
    return float(completion == "5")
"""


def main(argv: list[str] | None = None) -> Path:
    parser = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--calls", type=int, default=300, help="calls per mode and kind (medians)")
    parser.add_argument("--starts", type=int, default=12, help="fresh workers per mode (median start-up)")
    args = parser.parse_args(argv)
    if args.quick:
        args.calls, args.starts = 60, 4

    from thundersync_lightning.envs.datasets.rewards import call_reward, resolve_reward
    from thundersync_lightning.envs.tools import ToolWorkers, WorkerLimits, reward_workers
    from thundersync_lightning.envs.tools.confine import confinement

    limits = {"plain": WorkerLimits(sandbox="rlimits"), "confined": WorkerLimits(require_sandbox=True)}
    assert confinement(limits["confined"]) == "bwrap"
    module_dir = tempfile.mkdtemp(prefix="bench-user-")
    os.chmod(module_dir, 0o755)  # the confined worker's uid reads the module as others do
    Path(module_dir, "bench_user.py").write_text(USER_MODULE)
    sys.path.insert(0, module_dir)
    reward = resolve_reward("bench_user:score")

    samples: dict[str, dict[str, list[float]]] = {
        m: {"tool_call": [], "reward": [], "start": []} for m in MODES
    }
    pools = {m: ToolWorkers(max_idle=1, limits=limits[m]) for m in MODES}
    try:
        for mode in MODES:  # warm: each mode's tool worker and reward worker running
            assert pools[mode].call("bench_user:add", {"a": 2, "b": 3}, 30.0).text == "5"
            assert call_reward(reward, "p", "5", {}, limits=limits[mode]) == 1.0
        for _ in range(args.calls):
            for mode in MODES:
                start = time.perf_counter()
                pools[mode].call("bench_user:add", {"a": 2, "b": 3}, 30.0)
                samples[mode]["tool_call"].append(time.perf_counter() - start)
                start = time.perf_counter()
                call_reward(reward, "p", "5", {}, limits=limits[mode])
                samples[mode]["reward"].append(time.perf_counter() - start)
        for _ in range(args.starts):
            for mode in MODES:
                episode = ToolWorkers(max_idle=1, limits=limits[mode])
                start = time.perf_counter()
                outcome = episode.call("bench_user:add", {"a": 2, "b": 3}, 30.0)
                samples[mode]["start"].append(time.perf_counter() - start)
                episode.close()
                assert outcome.text == "5", outcome
    finally:
        for pool in pools.values():
            pool.close()
        for mode in MODES:
            reward_workers(limits[mode]).close()

    medians = {m: {k: median(v) for k, v in kinds.items()} for m, kinds in samples.items()}
    ratios = {k: medians["confined"][k] / medians["plain"][k] for k in ("tool_call", "reward", "start")}
    payload = {
        "settings": {
            "calls": args.calls,
            "starts": args.starts,
            "quick": args.quick,
            "confined_limits": repr(limits["confined"]),
        },
        "median_seconds": medians,
        "ratio_confined_over_plain": ratios,
    }
    path = write_result(args.out, NAME, payload)
    print(f"{path}: median s {medians}\nratios confined/plain {ratios}")
    return path


if __name__ == "__main__":
    main()
