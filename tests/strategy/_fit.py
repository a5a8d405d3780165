"""Shared helpers: a short real fit of the toy task (embedded engine, tiny Qwen3) per mode."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from lightning.pytorch import Callback

import thundersync_lightning  # noqa: F401  registers strategy="thundersync"
from thundersync_lightning.envs.toy import GuessingGameTasks, toy_model_spec
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig
from thundersync_lightning.strategy import StepStats, ThunderSyncStrategy

TOY_MODEL = dict(toy_model_spec().config)  # the tiny Qwen3 that learns the guessing game


class RecordSteps(Callback):
    """Keeps every step's StepStats (through the strategy's public property only)."""

    def __init__(self) -> None:
        self.steps: list[StepStats] = []

    def on_train_batch_end(self, trainer: Any, *args: Any, **kwargs: Any) -> None:
        self.steps.append(trainer.strategy.last_step_stats)


def toy_data(
    groups: int = 4, group_size: int = 4, seed: int = 0, latency: bool = False, engine: Any = None
) -> RolloutDataModule:
    """The toy task; ``latency`` delays each verdict a little (seeded; same trajectories and rewards),
    so that the learner backpropagates trajectories before their rewards and holds their gradients."""
    delay = {"latency": "lognormal", "latency_median_s": 0.005, "latency_max_s": 0.05} if latency else {}
    return RolloutDataModule(
        tasks=GuessingGameTasks(**{"latency": "none", **delay}),
        engine=engine or EmbeddedEngineConfig(num_threads=1, env_workers=4),
        group_size=group_size,
        groups_per_step=groups,
        seed=seed,
    )


def toy_policy(lr: float = 3e-3, dtype: str = "float32") -> GRPOPolicy:
    return GRPOPolicy(config=TOY_MODEL, lr=lr, dtype=dtype)


def fit(
    mode: str = "streaming",
    steps: int = 3,
    root: str | None = None,
    resume_from: str | None = None,
    policy: GRPOPolicy | None = None,
    strategy_kwargs: dict[str, Any] | None = None,
    data: RolloutDataModule | None = None,
    dtype: str = "float32",
    **trainer_kwargs: Any,
):
    """Returns (flat parameters after fit, recorded StepStats, trainer). ``dtype="float64"``: the
    policy's weights (and the engine's copy) in float64, where comparisons of modes or options that
    are exact in arithmetic differ by summation order alone (~1e-15), which load cannot push past a
    tolerance."""
    trainer_kwargs.pop("ckpt_path", None)
    L.seed_everything(0)
    policy = policy or toy_policy(dtype=dtype)
    record = RecordSteps()
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode, **(strategy_kwargs or {})),
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=trainer_kwargs.pop("enable_checkpointing", False),
        num_sanity_val_steps=0,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[record, *trainer_kwargs.pop("callbacks", [])],
        **trainer_kwargs,
    )
    trainer.fit(policy, data or toy_data(), ckpt_path=resume_from)
    return flat(policy), record.steps, trainer


def flat(module: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in module.parameters()])


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def outcomes(stats: StepStats) -> dict[str, tuple[Any, ...]]:
    """What a step trained on, per trajectory: reward, failure, finish reason, version, prompt, tokens."""
    return {
        t.trajectory_id: (
            t.reward,
            t.failure,
            t.finish_reason,
            t.policy_version,
            t.prompt,
            tuple(s.tokens for s in t.segments),
        )
        for t in stats.trajectories
    }
