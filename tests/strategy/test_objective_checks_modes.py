"""Every mode trains the module's objective; the on-policy check measures what staleness cannot."""

from __future__ import annotations

from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch import Callback

from thundersync_lightning.callbacks import StalenessMonitor
from thundersync_lightning.core import ConfigError, Objective, StalenessError
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import EmbeddedEngineConfig, TraceReplayEngineConfig
from thundersync_lightning.strategy import ThunderSyncStrategy

from ._fit import TOY_MODEL, RecordSteps


class GradientAtBarrier(Callback):
    """The gradient the optimizer is about to apply, per step (before clipping)."""

    def __init__(self) -> None:
        self.grads: list[torch.Tensor] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        ps = [p for p in pl_module.parameters() if p.requires_grad]
        self.grads.append(torch.cat([p.grad.detach().reshape(-1).clone() for p in ps]))


def _fit(
    mode: str,
    objective: Any,
    steps: int = 2,
    engine: Any = None,
    callbacks=(),
    temperature=None,
    cut=False,
    dtype: str = "float32",
):
    L.seed_everything(0)
    policy = GRPOPolicy(config=TOY_MODEL, objective=objective, temperature=temperature, dtype=dtype)
    grads, record = GradientAtBarrier(), RecordSteps()
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(mode=mode, boundary_cut=cut),
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[grads, record, *callbacks],
    )
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"),
        engine=engine or EmbeddedEngineConfig(num_threads=1, env_workers=4),
        group_size=4,
        groups_per_step=4,
        seed=0,
    )
    trainer.fit(policy, data)
    return grads.grads, record.steps


OBJECTIVES = {
    "rloo-token-mean-kl-entropy": Objective(
        estimator="rloo", loss_agg="token-mean", kl_coef=0.1, entropy_coef=0.01, singleton="reward"
    ),
    "trl-batch-drop": Objective.preset("trl", scale="batch", failed="drop", kl_coef=0.05, kl_estimator="k2"),
    "trl-kl-clip-min-overlong": Objective.preset(
        "trl",
        kl_coef=0.05,
        is_min=0.5,
        overlong_filter=True,
        is_batch_normalize=True,
        overlong_buffer=2,
        overlong_max_tokens=4,
        off_policy_mask=-1.0,  # -1: every trajectory flagged
    ),
    "verl-rejection": Objective.preset(
        "verl", rs="token_k1,seq_mean_k3", rs_threshold="0.999_1.001,0.01", kl_coef=0.05
    ),
}


_SLOW = {"trl-kl-clip-min-overlong", "verl-rejection"}  # the corrections' plumbing; the math is in tests/core


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=pytest.mark.slow) if n in _SLOW else n for n in sorted(OBJECTIVES)]
)
def test_streaming_and_sync_apply_the_same_gradient_of_the_modules_objective(name):
    # float64: the two differ by summation order alone (the second step's gradient after an AdamW step)
    streaming, steps = _fit("streaming", OBJECTIVES[name], dtype="float64")
    sync, _ = _fit("sync", OBJECTIVES[name], dtype="float64")
    assert len(streaming) == len(sync) == 2
    for a, b in zip(streaming, sync):
        assert float(b.norm()) > 0
        assert float((a - b).norm() / b.norm()) <= 1e-5
    default, _ = _fit("sync", Objective(), dtype="float64")
    assert float((default[0] - sync[0]).norm() / sync[0].norm()) > 1e-3  # the objective is not ignored


def test_the_embedded_engine_samples_what_the_learner_scores():
    _, steps = _fit("streaming", Objective(), callbacks=[StalenessMonitor(require_zero=True)])
    for s in steps:
        assert s.engine_learner_kl is not None and s.engine_learner_kl < 1e-6
        assert s.logprob_diff_max is not None and s.logprob_diff_max < 1e-4


def test_a_policy_temperature_that_differs_from_the_engines_is_refused_before_any_rollout_naming_both():
    engine = EmbeddedEngineConfig(num_threads=1, env_workers=4, temperature=1.5)
    with pytest.raises(ConfigError, match="policy temperature 1.0 vs engine temperature 1.5") as err:
        _fit("streaming", Objective(), engine=engine, temperature=1.0)
    assert "GRPOPolicy(temperature=1.0)" in str(err.value)
    assert "EmbeddedEngineConfig(temperature=1.5)" in str(err.value)


def test_the_policy_scores_at_the_engines_temperature_read_at_set_up():
    engine = EmbeddedEngineConfig(num_threads=1, env_workers=4, temperature=1.5)
    _, steps = _fit("streaming", Objective(), steps=1, engine=engine)
    assert steps[0].engine_learner_kl is not None and steps[0].engine_learner_kl < 1e-6


def test_a_policy_temperature_equal_to_the_engines_is_warned_as_redundant():
    from thundersync_lightning.strategy.objective_checks import check_objective

    class Data:
        engine_factory = EmbeddedEngineConfig(temperature=0.7)

    policy = GRPOPolicy(config=TOY_MODEL, temperature=0.7)
    with pytest.warns(UserWarning, match=r"GRPOPolicy\(temperature=0.7\).*repeats.*drop the policy's"):
        assert check_objective(policy, Data()) == []


def test_a_top_p_engine_is_refused_unless_importance_correction_is_on_and_then_the_gap_is_measured():
    engine = EmbeddedEngineConfig(num_threads=1, env_workers=4, top_p=0.7)
    with pytest.raises(ConfigError, match=r"top_p=0.7 < 1 truncates sampling.*is_correction"):
        _fit("streaming", Objective(), engine=engine)
    _, steps = _fit("streaming", Objective(is_correction="token_truncate"), steps=1, engine=engine)
    assert steps[0].engine_learner_kl > 1e-3  # the truncation shows in the measured KL


def test_a_temperature_mismatch_let_through_fails_the_kl_check_of_the_staleness_monitor():
    engine = EmbeddedEngineConfig(num_threads=1, env_workers=4, temperature=2.0)
    with pytest.raises(StalenessError, match="KL\\(engine \\|\\| learner\\)"):
        _fit(
            "streaming",
            Objective(is_correction="token_mask"),
            steps=1,
            engine=engine,
            callbacks=[StalenessMonitor(require_zero=True)],
            temperature=1.0,
        )


def test_importance_correction_without_engine_logprobs_is_refused_before_any_rollout():
    engine = TraceReplayEngineConfig(time_scale_s=0.001)
    with pytest.raises(
        ConfigError, match="is_correction='sequence_mask' needs the engine's sampling logprobs"
    ):
        _fit("streaming", "trl", engine=engine)


def test_kl_on_a_module_without_a_reference_policy_is_refused():
    from thundersync_lightning.strategy.objective_checks import check_objective

    class NoReference:
        objective = Objective(kl_coef=0.1)
        has_reference_policy = False

    assert any("needs a reference policy" in p for p in check_objective(NoReference(), None))
    assert GRPOPolicy(config=TOY_MODEL, objective=Objective(kl_coef=0.1)).has_reference_policy


def test_async_rollouts_are_measured_off_policy_and_importance_correction_runs_on_them():
    grads, steps = _fit("async", Objective(is_correction="token_truncate", is_cap=2.0), steps=3)
    assert [s.staleness_max for s in steps] == [0, 1, 1]
    assert steps[0].engine_learner_kl < 1e-6  # the first batch was generated by the same weights
    assert all(s.engine_learner_kl > 1e-6 for s in steps[1:])  # later ones one version earlier
    assert all(float(g.norm()) > 0 for g in grads)


@pytest.mark.parametrize(
    "mode",
    [
        "streaming",
        pytest.param("sync", marks=pytest.mark.slow),
        pytest.param("async", marks=pytest.mark.slow),
    ],
)
def test_the_boundary_cut_applies_the_uncut_gradient_in_every_mode(mode):
    objective = OBJECTIVES["rloo-token-mean-kl-entropy"]
    uncut, _ = _fit(mode, objective, dtype="float64")
    cut, steps = _fit(mode, objective, cut=True, dtype="float64")
    for a, b in zip(cut, uncut):
        assert float((a - b).norm() / b.norm()) <= 1e-5
    # the prompt runs once per group: fewer learner tokens than the whole trajectories
    assert all(s.learner_tokens < sum(t.num_tokens for t in s.trajectories) for s in steps)
