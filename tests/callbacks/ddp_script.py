"""Two gloo ranks on CPU, run as a script by test_callbacks_ddp.py (the popen launcher re-runs sys.argv).

``python -m tests.callbacks.ddp_script OUT``:

1. a Lightning DDP fit of 2 steps; each rank writes its monitors' last metrics to
   ``OUT/rank<r>.json``, rank 0's CSVLogger writes ``OUT/csv/version_0/metrics.csv`` and
   RunSummary writes ``OUT/summary.json``;
2. on the same process group, one barrier where only rank 1 holds a stale trajectory; each rank
   writes what StalenessMonitor raised to ``OUT/stale<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch

torch.set_num_threads(1)


def rank_stats(step: int, rank: int, world: int):
    from tests.callbacks.helpers import record, stats
    from thundersync_lightning.strategy.stats import AccumulatorBytes, Interval

    t0 = 10.0 * step
    if rank == 0:  # 3 trajectories, rewards 1 1 0, 4 5 6 tokens, on-policy; 8 s step, 2 s busy
        trajs = [
            record(i, reward=r, tokens=n, content_at=t0 + 1)
            for i, (r, n) in enumerate([(1, 4), (1, 5), (0, 6)])
        ]
        return stats(trajs, mode="async", version=step + 1, start=t0, end=t0 + 8,
                     busy=(Interval(t0 + 1, t0 + 3, "backward"),), learner_tokens=15, rank=0,
                     world_size=world, accumulator=AccumulatorBytes(device=100))  # fmt: skip
    # 1 trajectory, reward 0, 10 tokens, staleness 1; 10 s step, 5 s busy
    trajs = [record(5, reward=0.0, tokens=10, staleness=1, version=step + 1, content_at=t0 + 2)]
    return stats(trajs, mode="async", version=step + 1, start=t0, end=t0 + 10,
                 busy=(Interval(t0 + 2, t0 + 7, "backward"),), learner_tokens=10, rank=1, world_size=world,
                 accumulator=AccumulatorBytes(device=300))  # fmt: skip


def fit(out: str) -> int:
    import lightning.pytorch as pl
    from lightning.pytorch.loggers import CSVLogger

    from tests.callbacks.helpers import StatsDDPStrategy, TinyPolicy
    from thundersync_lightning.callbacks import (
        IdleTimeMonitor,
        MemoryMonitor,
        MFUMonitor,
        RolloutMetrics,
        RunSummary,
        StalenessMonitor,
    )

    monitors = [
        StalenessMonitor(),
        MFUMonitor(peak_flops=1e6),
        MemoryMonitor(),
        IdleTimeMonitor(),
        RolloutMetrics(),
    ]
    trainer = pl.Trainer(
        strategy=StatsDDPStrategy(rank_stats),
        accelerator="cpu",
        devices=2,
        max_steps=2,
        logger=CSVLogger(out, name="csv", version=0),
        callbacks=[*monitors, RunSummary(print_summary=False)],  # OUT/summary.json over both ranks
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=out,
    )
    trainer.fit(TinyPolicy())
    merged: dict[str, float] = {}
    for m in monitors:
        merged.update(m.last_metrics)
    with open(os.path.join(out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"global_step": trainer.global_step, "metrics": merged}, f)
    return trainer.global_rank


def stale_barrier(out: str, rank: int) -> None:
    import torch.distributed as dist

    from tests.callbacks.helpers import StubModule, end_step, record, stats, stub_trainer
    from thundersync_lightning.callbacks import StalenessMonitor

    assert dist.is_initialized() and dist.get_world_size() == 2
    trajs = [record(0, version=3, staleness=int(rank == 1))]
    result: dict[str, str | None] = {"raised": None}
    try:
        end_step(
            StalenessMonitor(),
            stub_trainer(),
            StubModule(),
            stats(trajs, mode="streaming", version=3, rank=rank),
        )
    except Exception as e:  # noqa: BLE001 - the test asserts the type
        result = {"raised": type(e).__name__, "message": str(e)}
    with open(os.path.join(out, f"stale{rank}.json"), "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    import torch.distributed as dist

    rank = fit(sys.argv[1])
    stale_barrier(sys.argv[1], rank)
    # tear the process group down before exit: gloo threads still joinable at interpreter
    # shutdown make the process abort ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()
