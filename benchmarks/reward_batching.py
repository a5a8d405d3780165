"""What calling a TRL reward per trajectory costs against one call per group, through the real worker.

TRL calls each reward once per batch with lists; here a TRL reward is called once per trajectory
(lists of one) as soon as its episode ends, because a trajectory whose reward is pending holds its
gradient: a call per group would make every member wait for the group's slowest episode. This
measures what that choice costs: the wall time of ``G`` calls of one completion against one call of
``G`` completions, through :func:`~thundersync_lightning.envs.tools.workers.reward_workers` (a
worker process per call, the reply in JSON), for the cheap rewards TRL users write (a regex on the
completion: ``tests/envs/peer_rewards.py:format_reward``).

    python benchmarks/reward_batching.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.envs.peer_rewards, importable by workers
from _common import add_common_args, median, write_result  # noqa: E402

NAME = "reward_batching"
REWARD = "tests.envs.peer_rewards:format_reward"


def main() -> None:
    parser = add_common_args(argparse.ArgumentParser(description=__doc__.splitlines()[0]))
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    repeats = 5 if args.quick else args.repeats

    from thundersync_lightning.envs.datasets import RewardInput
    from thundersync_lightning.envs.datasets.rewards import call_reward, resolve_reward
    from thundersync_lightning.envs.tools.workers import reward_workers

    reward = resolve_reward(REWARD)
    assert reward.path is not None
    inp = RewardInput(
        "What is 2 + 3?", "It is 5", {"prompt": "What is 2 + 3?", "answer": 5}, completion_ids=(1, 2, 3)
    )
    call_reward(reward, inp)  # a warm worker, as in a run
    rows = []
    for group in (4, 8, 16):
        single, batched = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            for _ in range(group):
                call_reward(reward, inp)
            single.append(time.perf_counter() - start)
            positional, keywords = reward.convention.call(inp, reward.params, reward.kwargs)
            keywords = {
                k: v * group if isinstance(v, list) else v for k, v in keywords.items()
            }  # G completions
            start = time.perf_counter()
            status, values = reward_workers().exchange(reward.path, positional, keywords, 60.0, None)
            batched.append(time.perf_counter() - start)
            assert status == "ok" and len(values) == group
        rows.append(
            {
                "group_size": group,
                "per_trajectory_ms": 1e3 * median(single),
                "per_group_ms": 1e3 * median(batched),
                "per_call_ms": 1e3 * median(single) / group,
            }
        )
        print(
            f"G={group:2d}: {group} calls of 1: {rows[-1]['per_trajectory_ms']:.2f} ms; 1 call of {group}: "
            f"{rows[-1]['per_group_ms']:.2f} ms; {rows[-1]['per_call_ms']:.2f} ms per call",
            flush=True,
        )
    write_result(args.out, NAME, {"reward": REWARD, "repeats": repeats, "rows": rows})


if __name__ == "__main__":
    main()
