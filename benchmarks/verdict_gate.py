"""What it costs to keep grading runs away from every acting episode of their task.

Two ways to close the channel from a grading run to an episode of the same task in another group
or step (docs/security.md, "Episodes"): hold a task's verdicts while any episode of that task acts
(the agent loop's verdict gate, keyed by task), or give every grading run a private copy of the
read-only files sandboxes share.

1. The gate's cost: one request of ``--groups`` groups x ``--size`` episodes through the real
   agent loop, environments that take ``--step-ms`` per turn for 1-8 turns and ``--verdict-ms`` per
   verdict (simulated, so only scheduling differs). Every group draws the same task (the gate holds
   verdicts across groups) against every group its own task (the gate is then per group, as
   before). Median wall time to the last reward; ratio same / distinct. Then across steps, as
   ahead-of-time or asynchronous issuing runs them: two requests run back to back on one loop (the
   second as soon as the first's content is final), every group of both drawing one task (the
   second step's episodes wait for the first's running verdicts) against each group of each step
   its own task; wall time to the second request's last reward, ratio same / distinct.
2. A private view's cost: the bytes of ``/usr`` (what every sandbox binds read-only) and the time
   to copy the sandbox Python's standard library alone (a lower bound on a private view) onto a
   tmpfs, against the time of one real grading run of a shipped local task (bubblewrap).

    python benchmarks/verdict_gate.py [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_common_args, median, write_result  # noqa: E402

NAME = "verdict_gate"


class _Env:
    def __init__(self, turns: int, step_s: float, verdict_s: float) -> None:
        self.turns, self.step_s, self.verdict_s, self.turn = turns, step_s, verdict_s, 0

    def reset(self) -> tuple[int, ...]:
        return (0,)

    def step(self, action: Sequence[int]):  # noqa: ANN201
        from thundersync_lightning.core.types import StepResult

        self.turn += 1
        time.sleep(self.step_s)
        return StepResult((1,), self.turn >= self.turns)

    def verdict(self) -> float:
        time.sleep(self.verdict_s)
        return 1.0

    def close(self) -> None:
        pass


class _Tasks:
    max_turns, max_action_tokens, stop_token = 8, 1, None

    def __init__(self, same: bool, step_s: float, verdict_s: float) -> None:
        self.same, self.step_s, self.verdict_s = same, step_s, verdict_s

    def tasks(self, step: int, num_groups: int, seed: int) -> list[str]:
        return ["task" if self.same else f"task-{step}-{g}" for g in range(num_groups)]

    def make_env(self, task: str, seed: int) -> _Env:
        return _Env(random.Random(seed).randint(1, 8), self.step_s, self.verdict_s)


def gate_cost(groups: int, size: int, step_s: float, verdict_s: float, repeats: int) -> dict:
    from thundersync_lightning.rollout import AgentLoop, EnvPool, Generation, make_request

    def generate(requests):  # noqa: ANN001, ANN202
        return [Generation((1,), (0.0,)) for _ in requests]

    out = {}
    for label, same in (("same_task", True), ("distinct_tasks", False)):
        tasks = _Tasks(same, step_s, verdict_s)
        times = []
        for r in range(repeats):
            pool = EnvPool(groups * size)
            try:
                began = time.perf_counter()
                done = AgentLoop(tasks, generate, pool, coalesce_s=0.0).run(
                    make_request(tasks, 0, groups, size, seed=r), 0, lambda e: None
                )
                assert done.wait(600)
                times.append(time.perf_counter() - began)
            finally:
                pool.shutdown()
        out[label] = {"seconds": times, "median_s": median(times)}
    out["same_over_distinct"] = out["same_task"]["median_s"] / out["distinct_tasks"]["median_s"]
    across = {}
    for label, same in (("same_task", True), ("distinct_tasks", False)):
        tasks = _Tasks(same, step_s, verdict_s)
        times = []
        for r in range(repeats):
            pool = EnvPool(2 * groups * size)
            try:
                loop = AgentLoop(tasks, generate, pool, coalesce_s=0.0)
                began = time.perf_counter()
                first = loop.run(make_request(tasks, 0, groups, size, seed=r), 0, lambda e: None)
                second = loop.run(make_request(tasks, 1, groups, size, seed=r), 1, lambda e: None)
                assert first.wait(600) and second.wait(600)
                times.append(time.perf_counter() - began)
            finally:
                pool.shutdown()
        across[label] = {"seconds": times, "median_s": median(times)}
    across["same_over_distinct"] = across["same_task"]["median_s"] / across["distinct_tasks"]["median_s"]
    out["across_steps"] = across
    return out


def private_view_cost(repeats: int) -> dict:
    from thundersync_lightning.envs.code import LocalCodeTasks
    from thundersync_lightning.envs.sandbox import bwrap_available
    from thundersync_lightning.envs.sandbox.fs import BoundedDir

    usr = int(
        subprocess.run(
            ["du", "-sb", "--one-file-system", "/usr"], capture_output=True, text=True, check=True
        ).stdout.split()[0]
    )
    stdlib = subprocess.run(
        ["python3", "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    copies = []
    for _ in range(repeats):
        target = tempfile.mkdtemp(prefix="tsl-view-", dir="/tmp")
        budget = BoundedDir(target, 4 * 1024**3, 1_000_000)
        try:
            began = time.perf_counter()
            shutil.copytree(stdlib, os.path.join(target, "stdlib"), symlinks=True)
            copies.append(time.perf_counter() - began)
        finally:
            budget.remove()
    grading = []
    if bwrap_available():
        source = LocalCodeTasks(
            names=["leap_year"],
            sandbox_root="/tmp/thundersync-bench-sandboxes",
            uid_base=3_990_000,
            uid_count=8,
        )
        task = source.all_tasks[0]
        for _ in range(repeats):
            env = source.make_env(task, 0)
            try:
                env.reset()
                began = time.perf_counter()
                env.workspace.evaluate(task.gold_patch)
                grading.append(time.perf_counter() - began)
            finally:
                env.close()
    out = {
        "usr_bytes": usr,
        "stdlib": stdlib,
        "stdlib_copy_s": copies,
        "stdlib_copy_median_s": median(copies),
        "grading_run_s": grading,
    }
    if grading:
        out["grading_run_median_s"] = median(grading)
        out["stdlib_copy_over_grading_run"] = median(copies) / median(grading)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_common_args(parser)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--size", type=int, default=4)
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--verdict-ms", type=float, default=500.0)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    repeats = 3 if args.quick else args.repeats
    gate = gate_cost(args.groups, args.size, args.step_ms / 1000, args.verdict_ms / 1000, repeats)
    view = private_view_cost(repeats)
    payload = {
        "settings": {
            "groups": args.groups,
            "size": args.size,
            "step_ms": args.step_ms,
            "verdict_ms": args.verdict_ms,
            "repeats": repeats,
            "python": sysconfig.get_python_version(),
        },
        "gate": gate,
        "private_view": view,
    }
    path = write_result(args.out, NAME, payload)
    print(
        f"{path}: same task / distinct tasks {gate['same_over_distinct']:.2f}x "
        f"(across two steps {gate['across_steps']['same_over_distinct']:.2f}x); "
        f"/usr {view['usr_bytes'] / 1e9:.2f} GB; stdlib copy / grading run "
        f"{view.get('stdlib_copy_over_grading_run', float('nan')):.2f}"
    )


if __name__ == "__main__":
    main()
