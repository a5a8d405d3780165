"""Failures, unscorable completions and out-of-bound rewards through the strategy in every mode: the
same step-0 gradient in streaming and sync, the stock-strategy path's equal to it, counted in the
step's records."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import lightning as L
import pytest
import torch

from thundersync_lightning.core import Objective
from thundersync_lightning.core.types import RewardReady
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig
from thundersync_lightning.strategy import ThunderSyncStrategy

from ._fit import TOY_MODEL, RecordSteps
from .test_objective_checks_modes import GradientAtBarrier


def _rewrite(event: RewardReady) -> RewardReady:
    """Member 0 crashes, member 1 is unscorable, member 2 returns a reward beyond max_abs_reward,
    the others are graded with a penalty (reward - 2 <= 0): a failure trained as 0.0 would be the best."""
    k = int(event.trajectory_id.rsplit("-t", 1)[1])
    if k == 0:
        return replace(event, reward=0.0, failure="verdict raised ValueError: crash")
    if k == 1:
        return replace(event, reward=0.0, unscorable=True)
    if k == 2:
        return replace(event, reward=-1e308)
    return replace(event, reward=event.reward - 2.0)


class _Rewriting:
    def __init__(self, engine: Any) -> None:
        self._engine = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def rollout(self, request: Any):
        for event in self._engine.rollout(request):
            yield _rewrite(event) if isinstance(event, RewardReady) else event


@dataclass
class RewritingEngine:
    """An embedded engine whose verdicts are rewritten by :func:`_rewrite`."""

    inner: EmbeddedEngineConfig

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def build(self, model_spec: Any, tasks: Any) -> Any:
        return _Rewriting(self.inner.build(model_spec, tasks))


def _fit(mode: str | None, objective: Objective, steps: int = 1, **data_kwargs: Any):
    L.seed_everything(0)
    policy = GRPOPolicy(config=TOY_MODEL, dtype="float64", objective=objective)
    grads, record = GradientAtBarrier(), RecordSteps()
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode) if mode is not None else "auto",
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[grads, record] if mode is not None else [grads],
    )
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=RewritingEngine(EmbeddedEngineConfig(num_threads=1, env_workers=2)),
        group_size=5,
        groups_per_step=2,
        seed=0,
        **data_kwargs,
    )
    trainer.fit(policy, data)
    return grads.grads, record.steps


@pytest.mark.parametrize(
    "objective",
    [
        Objective(kl_coef=0.05, loss_agg="token-mean"),
        pytest.param(Objective(estimator="rloo"), marks=pytest.mark.slow),
    ],
)
def test_streaming_sync_and_a_stock_strategy_train_failures_and_unscorables_alike(objective):
    streaming, steps = _fit("streaming", objective)
    sync, _ = _fit("sync", objective)
    stock, _ = _fit(None, objective)
    assert float(sync[0].norm()) > 0
    for got in (streaming[0], stock[0]):
        assert float((got - sync[0]).norm() / sync[0].norm()) <= 1e-6  # as in test_core_step0_gradients
    records = steps[0].trajectories
    assert sum(r.unscorable for r in records) == 2 and all(r.reward is None for r in records if r.unscorable)
    refused = [r for r in records if r.trajectory_id.endswith("-t2")]
    assert all("beyond max_abs_reward" in r.failure for r in refused)


def test_async_mode_counts_unscorables_and_steps_on_finite_gradients():
    grads, steps = _fit("async", Objective(), steps=2)
    assert len(grads) == 2 and all(bool(torch.isfinite(g).all()) for g in grads)
    assert all(sum(r.unscorable for r in s.trajectories) == 2 for s in steps)


# two more fits; the accumulator's part is in tests/core/accumulator/test_streaming_dynamic_sampling.py
@pytest.mark.slow
def test_dynamic_sampling_sees_floored_failures_and_unscorables_alike_in_streaming_and_sync():
    objective = Objective(kl_coef=0.05)
    streaming, steps = _fit("streaming", objective, dynamic_sampling=True, max_extra_groups=2)
    sync, _ = _fit("sync", objective, dynamic_sampling=True, max_extra_groups=2)
    assert float((streaming[0] - sync[0]).norm() / sync[0].norm()) <= 1e-6
    assert sum(r.unscorable for r in steps[0].trajectories) >= 2
