"""Synthetic step statistics, stub trainers and a real-Trainer harness for the callback tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
from torch import nn

from thundersync_lightning.strategy.stats import AccumulatorBytes, Interval, StepStats, TrajectoryRecord


def record(
    i: int,
    *,
    step: int = 0,
    staleness: int = 0,
    version: int = 0,
    reward: float | None = 1.0,
    tokens: int = 10,
    scored: int = 4,
    turns: int = 2,
    finish: str = "submit",
    failure: str | None = None,
    content_at: float | None = None,
    reward_at: float | None = None,
) -> TrajectoryRecord:
    content = 100.0 + i if content_at is None else content_at
    return TrajectoryRecord(
        trajectory_id=f"s{step}-g{i // 2}-t{i % 2}",
        group_id=f"s{step}-g{i // 2}",
        policy_version=version - staleness,
        staleness=staleness,
        reward=reward,
        num_tokens=tokens,
        num_scored_tokens=scored,
        num_turns=turns,
        finish_reason=finish,
        failure=failure,
        content_ready_at=content,
        reward_ready_at=content if reward_at is None and reward is not None else reward_at,
    )


def stats(
    trajectories: tuple[TrajectoryRecord, ...] = (),
    *,
    step: int = 0,
    mode: str = "streaming",
    version: int = 0,
    start: float = 100.0,
    end: float = 102.0,
    busy: tuple[Interval, ...] = (),
    learner_tokens: int = 0,
    rank: int = 0,
    world_size: int = 1,
    accumulator: AccumulatorBytes | None = None,
    **kwargs: Any,
) -> StepStats:
    return StepStats(
        step=step,
        mode=mode,
        policy_version=version,
        rank=rank,
        world_size=world_size,
        step_start=start,
        step_end=end,
        trajectories=tuple(trajectories),
        busy=busy,
        open_groups=kwargs.pop("open_groups", ()),
        accumulator=accumulator or AccumulatorBytes(),
        learner_tokens=learner_tokens,
        **kwargs,
    )


@dataclass
class StubModule:
    """What the monitors use of a LightningModule: ``device``, ``log`` and ``model``."""

    model: Any = None
    device: torch.device = torch.device("cpu")
    logged: dict[str, float] = field(default_factory=dict)

    def log(self, name: str, value: torch.Tensor, **kwargs: Any) -> None:
        assert kwargs["on_step"] and not kwargs["on_epoch"], kwargs
        self.logged[name] = value.item()


def stub_trainer(**kwargs: Any) -> SimpleNamespace:
    """What the monitors use of a Trainer: ``strategy.last_step_stats`` and a few public fields."""
    defaults: dict[str, Any] = {
        "strategy": SimpleNamespace(last_step_stats=None, mode="streaming", broadcast=lambda obj, src=0: obj),
        "world_size": 1,
        "global_rank": 0,
        "precision": "32-true",
        "loggers": [],
        "log_dir": None,
        "default_root_dir": ".",
        "callbacks": [],
    }
    defaults.update(kwargs)
    return SimpleNamespace(**defaults)


def end_step(callback: pl.Callback, trainer: Any, module: Any, step_stats: StepStats) -> None:
    """Run one barrier: publish ``step_stats`` and call the batch-end hook."""
    trainer.strategy.last_step_stats = step_stats
    callback.on_train_batch_end(trainer, module, None, None, 0)


class TinyLM(nn.Module):
    """A hand-countable stand-in for a Hugging Face causal LM.

    Embedding 10x4 (a lookup), one 4x4 projection, an untied 4x10 head: N_fwd = 16 + 40 = 56.
    L=1 layer, H=2 heads, Q=2 head dim.
    """

    def __init__(self, tie: bool = False) -> None:
        super().__init__()
        self.config = SimpleNamespace(num_hidden_layers=1, num_attention_heads=2, head_dim=2, hidden_size=4)
        self.embed = nn.Embedding(10, 4)
        self.proj = nn.Linear(4, 4, bias=False)
        self.head = nn.Linear(4, 10, bias=False)
        if tie:
            self.head.weight = self.embed.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.embed

    def get_output_embeddings(self) -> nn.Module:
        return self.head

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.proj(self.embed(ids)))  # (B, T, V)


class TinyPolicy(pl.LightningModule):
    """A LightningModule around :class:`TinyLM` that trains on random token batches."""

    def __init__(self) -> None:
        super().__init__()
        self.model = TinyLM()

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        logits = self.model(batch[:, :-1])
        return nn.functional.cross_entropy(logits.reshape(-1, 10), batch[:, 1:].reshape(-1))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> Any:
        g = torch.Generator().manual_seed(0)
        return torch.utils.data.DataLoader(torch.randint(0, 10, (8, 6), generator=g), batch_size=2)


_LAUNCH_VARS = {"MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "GLOBAL_RANK", "RANK", "WORLD_SIZE"}


def subprocess_env(**extra: str) -> dict[str, str]:
    """This process's environment without torch.distributed launch variables (a fit in this
    process may have set them; a child must start its own process group), plus ``extra``."""
    return {**{k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS}, **extra}


StatsFn = Callable[[int, int, int], StepStats]  # (step, rank, world_size) -> stats


class _RecordsStats:
    """Mixin: after each optimizer step, publish ``stats_fn(step, rank, world)`` as
    ``last_step_stats`` (what ThunderSyncStrategy does at its barrier)."""

    stats_fn: StatsFn
    _stats: StepStats | None = None
    _step = 0

    @property
    def last_step_stats(self) -> StepStats | None:
        return self._stats

    def optimizer_step(self, *args: Any, **kwargs: Any) -> Any:
        out = super().optimizer_step(*args, **kwargs)  # type: ignore[misc]
        self._stats = self.stats_fn(self._step, self.global_rank, self.world_size)  # type: ignore[attr-defined]
        self._step += 1
        return out


class StatsStrategy(_RecordsStats, SingleDeviceStrategy):
    def __init__(self, stats_fn: StatsFn) -> None:
        super().__init__(device=torch.device("cpu"))
        self.stats_fn = stats_fn


class StatsDDPStrategy(_RecordsStats, DDPStrategy):
    def __init__(self, stats_fn: StatsFn, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stats_fn = stats_fn
