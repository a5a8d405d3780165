"""The learner's CPU seconds for one step's work, by how the work is cut into calls: the two
defaults ``max_batch_trajectories="auto"`` and ``hold_after_s="auto"`` against what they replace.

The step is :mod:`vs_trl`'s single-turn shape (8 groups x 8 trajectories, a 22-token prompt and
6-16 generated tokens each, its tiny Qwen3: hidden 64, 2 layers, vocabulary 512, float32, one
thread), its events fed to the real :class:`~thundersync_lightning.strategy.runner.StepRunner` and
accumulator in this process (no engine: the learner's work alone). Cases, interleaved (A B, B A,
...) and measured in ``time.process_time`` seconds (the process's CPU, robust to a loaded machine):

- ``sync_rows_32`` / ``sync_rows_auto``: every trajectory and reward waiting (sync), calls of at
  most 32 rows (the former fixed default: two calls) or the whole step (what "auto" resolves to
  where the plan fits: one call);
- ``streaming_held`` / ``streaming_waited``: every content lands, the rewards land right after
  it; the learner holds the waiting rows at once (``hold_after_s=0``: the rewards are withheld
  until its first call, so it does: one split call of 64 held rows, then a fold each) or waits for
  the rewards (a wait longer than their lag: direct calls of whole groups). The split backward is
  chosen as a fit chooses it (``split_backward="auto"``); every call waits for the 64 contents first.

    python benchmarks/learner_paths.py [--reps 15] [--out DIR] [--note TEXT]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from _common import write_result  # noqa: E402
from thundersync_lightning.backends.split import choose_backend  # noqa: E402
from thundersync_lightning.core import PolicySnapshot, StreamingGRPO  # noqa: E402
from thundersync_lightning.core.types import (  # noqa: E402
    ContentReady,
    GroupRequest,
    RewardReady,
    RolloutRequest,
    Segment,
    Trajectory,
)
from thundersync_lightning.modules import GRPOPolicy  # noqa: E402
from thundersync_lightning.strategy.runner import RunnerSettings, StepRunner  # noqa: E402

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: vs_trl's model (its MODEL, with the vocabulary its tokenizer has)
MODEL = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=32, max_position_embeddings=1024, tie_word_embeddings=False,
             vocab_size=512)  # fmt: skip
GROUPS, GROUP_SIZE, PROMPT = 8, 8, 22
#: case -> (max_batch_trajectories, hold_after_s, defer (sync), rewards only after the learner's first call)
CASES: dict[str, tuple[int, float, bool, bool]] = {
    "sync_rows_32": (32, 0.0, True, False),
    "sync_rows_auto": (GROUPS * GROUP_SIZE, 0.0, True, False),
    "streaming_held": (GROUPS * GROUP_SIZE, 0.0, False, True),
    "streaming_waited": (GROUPS * GROUP_SIZE, 600.0, False, False),
}


class _Signalling(StreamingGRPO):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.called = threading.Event()

    def add_tokens(self, *args: Any, **kwargs: Any) -> None:
        super().add_tokens(*args, **kwargs)
        self.called.set()


class Bench:
    def __init__(self, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.policy = GRPOPolicy(config=MODEL)
        self.params = [p for p in self.policy.parameters() if p.requires_grad]
        rng = random.Random(seed)
        groups = tuple(GroupRequest(f"s0-g{g}", g, None, GROUP_SIZE) for g in range(GROUPS))
        self.request = RolloutRequest(step=0, groups=groups, seed=seed)
        self.trajectories: dict[str, Trajectory] = {}
        for gid, tids in self.request.trajectory_ids().items():
            prompt = tuple(rng.randrange(MODEL["vocab_size"]) for _ in range(PROMPT))
            for tid in tids:
                action = tuple(rng.randrange(MODEL["vocab_size"]) for _ in range(rng.randint(6, 16)))
                self.trajectories[tid] = Trajectory(
                    tid, gid, 0, prompt, (Segment(action, True),), 0, 1, "stop", 0.0, 0.0
                )
        self.rewards = {t: rng.random() for t in self.trajectories}
        backend = choose_backend(
            "auto", self.policy, self.params, mode="streaming", boundary_cut=False, sharding="none"
        )
        self.acc = _Signalling(self.params, backend=backend)

    def _score(self, trajectories: Any, prefix: Any = None, watch: Any = None) -> Any:
        extra = {"watch": watch} if watch is not None else {}
        return self.policy.score_tokens(trajectories, **self.acc.score_needs, **extra)

    def once(self, case: str) -> dict[str, Any]:
        rows, wait, defer, withhold = CASES[case]
        acc = self.acc
        acc.reset()
        acc.called.clear()
        for p in self.params:
            p.grad = None

        def events() -> Iterator[Any]:
            for t in self.trajectories.values():
                yield ContentReady(t, 0.0)
            if withhold:  # the learner holds the rows before any reward lands (bounded: never hangs)
                acc.called.wait(timeout=120)
            for tid, t in self.trajectories.items():
                yield RewardReady(tid, t.group_id, self.rewards[tid], 0.0)

        # the first call waits for every content (as when generation lands the batch at once)
        settings = RunnerSettings(
            defer=defer, max_batch_trajectories=rows, min_batch_trajectories=rows, hold_after_s=wait
        )
        runner = StepRunner(self.request, PolicySnapshot(self.policy), acc, self._score, settings)
        start = time.process_time()
        outcome = runner.run(events())
        acc.finish()
        cpu = time.process_time() - start
        calls = [i for i in outcome.busy if i.kind == "backward"]
        return {"cpu_s": cpu, "calls": len(calls), "paths": [i.path for i in calls]}


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=15, help="measured steps per case (after one warm-up)")
    parser.add_argument("--out", type=Path, default=RESULTS_DIR)
    parser.add_argument("--note", default="", help="what the machine was doing (recorded)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    bench = Bench()
    load_start = list(os.getloadavg())
    names = list(CASES)
    shapes = {name: bench.once(name) for name in names}  # warm-up; calls and paths are the same each rep
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            seconds[name].append(bench.once(name)["cpu_s"])
    cases = {
        name: {
            "learner_calls": shapes[name]["calls"],
            "paths": shapes[name]["paths"],
            "cpu_s_median": statistics.median(seconds[name]),
            "cpu_s_mean": statistics.mean(seconds[name]),
            "cpu_s": seconds[name],
        }
        for name in names
    }
    med = {name: c["cpu_s_median"] for name, c in cases.items()}
    payload = {
        "settings": {"reps": args.reps, "groups": GROUPS, "group_size": GROUP_SIZE, "model": MODEL},
        "loaded_machine": {
            "load_average_start": load_start,
            "load_average_end": list(os.getloadavg()),
            "note": args.note,
        },  # fmt: skip
        "cases": cases,
        "ratios": {
            "sync_rows_auto_over_rows_32": med["sync_rows_auto"] / med["sync_rows_32"],
            "streaming_waited_over_held": med["streaming_waited"] / med["streaming_held"],
        },
    }
    path = write_result(args.out, "learner_paths", payload)
    for name, c in cases.items():
        print(f"{name:18s} calls {c['learner_calls']} {c['paths']}: CPU median {c['cpu_s_median']:.4f} s")
    print(f"wrote {path}")
    return path


if __name__ == "__main__":
    main()
