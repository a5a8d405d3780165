"""Soak: hundreds of real toy RL steps, then resource use before vs after. Nothing may grow.

One Lightning fit of the toy task (``configs/toy.yaml``'s setup: the guessing game, the tiny
Qwen3, the embedded engine, streaming mode, the rollout monitors; by default 8 groups x 4 instead
of 16 x 8 and no simulated verdict latency, so 500 steps take minutes on 2 cores). After ``--warmup``
steps (allocator pools, thread pools and lazily built objects have settled) and again at the last
step, while the engine still runs, it samples the learner process and its children, each time at
the ends of ``--window`` consecutive steps, and keeps every metric's minimum over them (a weight
snapshot in flight moves the counts by 1-3 from one step's end to the next; see ``Sampler``):

- ``rss_mb``: resident memory of the learner, and of the engine process(es) and the fork
  server they are forked from (``engine_rss_mb``);
- ``threads``: threads of the learner plus those of its children;
- ``fds``: open file descriptors of the learner plus its children;
- ``children``: live descendant processes (the engine, multiprocessing's fork server and resource
  tracker);
- ``shm_segments``: distinct ``/dev/shm`` files (named or already unlinked) mapped by the learner
  and its children: queue semaphores and shared-memory weight snapshots.

Flat means: threads, fds, children and shm segments exactly equal; RSS growth (learner and
engine) below ``--rss-bound-mb``. The JSON records both samples (with the steps of their windows),
the per-step series of every metric (every ``--every`` steps), the deltas and the verdict.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import psutil
import torch
from lightning.pytorch import Callback

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_common_args, write_result  # noqa: E402
from _harness import load_average  # noqa: E402
from thundersync_lightning.callbacks import IdleTimeMonitor, RolloutMetrics, StalenessMonitor  # noqa: E402
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.rollout import EmbeddedEngineConfig  # noqa: E402
from thundersync_lightning.strategy import ThunderSyncStrategy  # noqa: E402

EXACT = ("threads", "fds", "children", "shm_segments")


def _shm_maps(pid: int) -> set[str]:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return {
                line.split()[5]
                for line in maps
                if len(line.split()) >= 6 and line.split()[5].startswith("/dev/shm/")
            }
    except OSError:
        return set()


def sample() -> dict[str, float]:
    """Resource use of this process and its live children (after a full garbage collection)."""
    gc.collect()
    me = psutil.Process()
    kids = []
    for child in me.children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                kids.append(child)
        except psutil.NoSuchProcess:
            pass
    threads, fds, shm = me.num_threads(), me.num_fds(), _shm_maps(me.pid)
    engine_rss = 0
    for child in kids:
        try:
            threads += child.num_threads()
            fds += child.num_fds()
            shm |= _shm_maps(child.pid)
            if "resource_tracker" not in " ".join(child.cmdline()):
                engine_rss += child.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return {
        "rss_mb": me.memory_info().rss / 2**20,
        "engine_rss_mb": engine_rss / 2**20,
        "threads": threads,
        "fds": fds,
        "children": len(kids),
        "shm_segments": len(shm),
    }


class Sampler(Callback):
    """Samples every ``every`` steps (the series) and at the ends of the first and last ``window``
    steps; ``before`` and ``after`` are each window's per-metric minimum.

    Why a minimum: at a step's end a weight snapshot may be in flight (the new one's shared-memory
    fd open in the learner and the engine, the previous one not yet released, the fd sharer's
    socket open), which moves the counts by 1-3 from one step to the next. A leak stays; such a
    transient does not, so a window's minimum is the count without it.
    """

    def __init__(self, warmup: int, last: int, every: int, window: int = 5) -> None:
        self.warmup, self.last, self.every, self.window = warmup, last, every, window
        self.series: list[dict[str, float]] = []
        self.first: list[dict[str, float]] = []
        self.final: list[dict[str, float]] = []

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        step = trainer.global_step  # optimizer steps done
        in_first = self.warmup <= step < self.warmup + self.window
        in_final = self.last - self.window < step <= self.last
        if not (in_first or in_final or step % self.every == 0):
            return
        s = {"step": step, **sample()}
        if step % self.every == 0 or step in (self.warmup, self.last):
            self.series.append(s)
        if in_first:
            self.first.append(s)
        elif in_final:
            self.final.append(s)

    @staticmethod
    def _floor(window: list[dict[str, float]], step: int) -> dict[str, float] | None:
        if not window:
            return None
        keys = [k for k in window[0] if k != "step"]
        return {
            "step": step,
            "window_steps": [w["step"] for w in window],
            **{k: min(w[k] for w in window) for k in keys},
        }

    @property
    def before(self) -> dict[str, float] | None:
        return self._floor(self.first, self.warmup)

    @property
    def after(self) -> dict[str, float] | None:
        return self._floor(self.final, self.last)


def run(
    steps: int,
    warmup: int,
    groups: int,
    group_size: int,
    every: int,
    latency_median_s: float,
    rss_bound_mb: float,
    window: int = 5,
) -> dict[str, Any]:
    if not 0 < warmup < steps:
        raise SystemExit(f"--warmup must be in (0, --steps), got {warmup} for {steps} steps")
    if not 1 <= window <= steps - warmup - window + 1:
        raise SystemExit(f"--window must be in [1, (steps - warmup + 1) / 2], got {window}")
    tasks = GuessingGameTasks(
        latency="lognormal" if latency_median_s > 0 else "none",
        latency_median_s=latency_median_s if latency_median_s > 0 else 0.03,
    )
    data = RolloutDataModule(
        tasks=tasks,
        engine=EmbeddedEngineConfig(temperature=1.0, num_threads=1, env_workers=8),
        group_size=group_size,
        groups_per_step=groups,
        seed=0,
    )
    policy = GRPOPolicy(config=dict(toy_model_spec().config), lr=3e-3)
    sampler = Sampler(warmup, steps, every, window)
    # A bare Trainer (no recorder keeping every step's StepStats, unlike _harness.fit): whatever
    # grows here grows in a real run too.
    os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="thundersync-soak-") as root:
        trainer = L.Trainer(
            strategy=ThunderSyncStrategy(mode="streaming"),
            accelerator="cpu",
            devices=1,
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            gradient_clip_val=1.0,
            default_root_dir=root,
            callbacks=[sampler, RolloutMetrics(), StalenessMonitor(), IdleTimeMonitor()],
        )
        trainer.fit(policy, data)
    wall = time.monotonic() - start
    before, after = sampler.before, sampler.after
    assert before is not None and after is not None
    delta = {k: after[k] - before[k] for k in before if k not in ("step", "window_steps")}
    flat_exact = {k: delta[k] == 0 for k in EXACT}
    flat_rss = {k: delta[k] < rss_bound_mb for k in ("rss_mb", "engine_rss_mb")}
    return {
        "steps": steps,
        "warmup_steps": warmup,
        "groups": groups,
        "group_size": group_size,
        "verdict_latency_median_s": latency_median_s,
        "wall_seconds": round(wall, 1),
        "window_steps": window,
        "before": before,
        "after": after,
        "delta": delta,
        "bounds": {"exact": list(EXACT), "rss_growth_mb_below": rss_bound_mb},
        "flat": {**flat_exact, **flat_rss},
        "all_flat": all(flat_exact.values()) and all(flat_rss.values()),
        "series": sampler.series,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(parser, default_threads=1)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--window",
        type=int,
        default=5,
        help="before/after: per-metric minimum over this many consecutive step ends",
    )
    parser.add_argument("--groups", type=int, default=8, help="(toy.yaml: 16; 8 x 4 keeps 500 steps short)")
    parser.add_argument("--group-size", type=int, default=4, help="(toy.yaml: 8)")
    parser.add_argument("--every", type=int, default=25, help="sample every N steps for the series")
    parser.add_argument(
        "--latency-median", type=float, default=0.0, help="verdict latency median, s (0: none)"
    )
    parser.add_argument("--rss-bound-mb", type=float, default=50.0)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.groups, args.group_size = 100, 4, 4
    torch.set_num_threads(args.threads)
    load_start = load_average()
    result = run(
        args.steps,
        args.warmup,
        args.groups,
        args.group_size,
        args.every,
        args.latency_median,
        args.rss_bound_mb,
        args.window,
    )
    payload = {
        "threads": args.threads,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        **result,
    }
    path = write_result(args.out, "soak", payload)
    d = result["delta"]
    print(
        f"soak: {args.steps} steps in {result['wall_seconds']} s; growth after step {args.warmup}: "
        f"learner RSS {d['rss_mb']:+.1f} MB, engine RSS {d['engine_rss_mb']:+.1f} MB, threads "
        f"{d['threads']:+d}, fds {d['fds']:+d}, children {d['children']:+d}, shm {d['shm_segments']:+d} "
        f"-> {'flat' if result['all_flat'] else 'NOT flat'} ({path})"
    )
    return payload


if __name__ == "__main__":
    main()
