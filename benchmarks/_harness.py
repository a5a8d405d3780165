"""Harness shared by overlap.py, sample_efficiency.py and memory.py: the project's real code paths.

Everything here drives the package's public API: a Lightning ``Trainer`` with
:class:`ThunderSyncStrategy`, :class:`GRPOPolicy`, :class:`RolloutDataModule` and an engine
configuration. Nothing re-implements the strategy; step statistics are read the way any callback
reads them (``trainer.strategy.last_step_stats`` in ``on_train_batch_end``).

JSON output (command line, machine description, load average, commit) goes through
``_common.write_result``; this module adds what those scripts share on top of it.
"""

from __future__ import annotations

import logging
import math
import os
import random
import tempfile
import time
import warnings
from collections.abc import Sequence
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import lightning as L  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402

import thundersync_lightning  # noqa: E402,F401  registers strategy="thundersync"
from thundersync_lightning.core.types import derive_seed  # noqa: E402
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule  # noqa: E402
from thundersync_lightning.rollout.replay import load_trace  # noqa: E402
from thundersync_lightning.strategy import StepStats, ThunderSyncStrategy  # noqa: E402

MODES = ("sync", "streaming", "async")

# Lightning's per-fit banners (accelerator, tips) and deprecation chatter would drown the progress lines.
logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)
warnings.filterwarnings("ignore", message=".*(does not have many workers|LeafSpec|litlogger).*")
MODE_COLORS = {"sync": "tab:red", "streaming": "tab:green", "async": "tab:blue"}


def qwen3_config(hidden: int, intermediate: int, layers: int, vocab: int, max_positions: int = 512) -> dict:
    """A randomly initialised Qwen3 (head_dim 64, like the project's tiny models)."""
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": max(1, hidden // 64),
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": False,
    }


def matmul_params(module: torch.nn.Module) -> int:
    """N of the analytic 6*N*tokens FLOP count: every parameter except the input embedding table
    (a lookup, no matmul)."""
    total = sum(p.numel() for p in module.parameters())
    model = getattr(module, "model", module)
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if callable(get) else None
    return total - (emb.weight.numel() if emb is not None else 0)


def peak_flops(
    device: torch.device, size: int = 1024, repeats: int = 5, dtype: torch.dtype = torch.float32
) -> float:
    """Achievable peak FLOP/s: the best of ``repeats`` ``size x size`` matmuls in ``dtype`` (2 size^3
    FLOPs each) after one warm-up, with the threads the benchmark uses."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    a @ b
    _sync(device)
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RecordSteps(Callback):
    """Keeps every step's StepStats (read through the strategy's public property) and its
    wall-clock end as seen by the callback (``time.monotonic``, the clock StepStats uses)."""

    def __init__(self, on_step: Any = None) -> None:
        self.steps: list[StepStats] = []
        self.ends: list[float] = []
        self.on_step = on_step

    def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any, **kwargs: Any) -> None:
        stats = trainer.strategy.last_step_stats
        self.steps.append(stats)
        self.ends.append(time.monotonic())
        if self.on_step is not None:
            self.on_step(trainer, pl_module, stats)


def fit(
    mode: str,
    policy: GRPOPolicy,
    data: RolloutDataModule,
    steps: int,
    device: str = "cpu",
    callbacks: Sequence[Callback] = (),
    trainer_kwargs: dict | None = None,
    on_step: Any = None,
    **strategy_kwargs: Any,
) -> RecordSteps:
    """One real ``Trainer.fit`` of ``steps`` RL steps in ``mode``; returns the recorder.
    ``on_step(trainer, module, stats)`` runs in ``on_train_batch_end`` after the stats are kept."""
    record = RecordSteps(on_step)
    # Lightning's DDP launcher calls torch.set_num_threads(cpu_count // processes) unless
    # OMP_NUM_THREADS is set: pin it to the threads the benchmark chose.
    os.environ["OMP_NUM_THREADS"] = str(torch.get_num_threads())
    with tempfile.TemporaryDirectory(prefix="thundersync-bench-") as root:
        trainer = L.Trainer(
            strategy=ThunderSyncStrategy(mode=mode, **strategy_kwargs),
            accelerator=device,
            devices=1,
            max_steps=steps,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
            default_root_dir=root,
            callbacks=[record, *callbacks],
            **(trainer_kwargs or {}),
        )
        trainer.fit(policy, data)
    return record


def trace_schedule(
    trace: str, seed: int, step: int, groups: int, group_size: int
) -> list[tuple[float, float]]:
    """(content_ready, reward_ready) in trace units of every trajectory of a step, drawn as
    :class:`TraceReplayEngine` draws them (a row per trajectory from ``Random(derive_seed(...))``)."""
    rows = load_trace(trace)
    out = []
    for g in range(groups):
        for k in range(group_size):
            row = rows[random.Random(derive_seed(seed, step, g, k)).randrange(len(rows))]
            out.append((row.content_ready, row.reward_ready))
    return out


def schedule_index(trajectory_id: str, group_size: int) -> int:
    """Position of "s{step}-g{g}-t{k}" in trace_schedule's order."""
    g, k = (int(part[1:]) for part in trajectory_id.split("-")[1:])
    return g * group_size + k


def direct_accumulator(policy: GRPOPolicy, batch: Sequence[Any]) -> Any:
    """A StreamingGRPO over the policy's trainable parameters with every group of ``batch`` open
    and every reward known (0, 1, 0, ... per group): its calls take the direct path, one
    destination, as the synchronous learner's do."""
    from thundersync_lightning.core import StreamingGRPO

    acc = StreamingGRPO([p for p in policy.parameters() if p.requires_grad], objective=policy.objective)
    for g in sorted({t.group_id for t in batch}):
        members = [t.trajectory_id for t in batch if t.group_id == g]
        acc.open_group(g, members)
        for k, tid in enumerate(members):
            acc.add_reward(tid, float(k % 2))
    return acc


def flat_params(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to("cpu", torch.float64) for p in module.parameters()])


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
