"""The registry name, and clear errors for configurations that cannot train correctly."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch import LightningModule

import thundersync_lightning
from thundersync_lightning.core.errors import ConfigError, GroupError
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.rollout import TraceReplayEngineConfig
from thundersync_lightning.strategy import ThunderSyncStrategy

from ._fit import TOY_MODEL, toy_data


def _trainer(strategy="thundersync", **kwargs):
    return L.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_steps=kwargs.pop("max_steps", 1),
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )


def test_the_strategy_name_resolves_after_importing_the_package():
    assert thundersync_lightning.ThunderSyncStrategy is ThunderSyncStrategy
    trainer = _trainer("thundersync")
    assert isinstance(trainer.strategy, ThunderSyncStrategy)
    assert trainer.strategy.mode == "streaming"


def test_a_bad_mode_is_rejected_with_the_valid_modes():
    with pytest.raises(ConfigError, match="streaming"):
        ThunderSyncStrategy(mode="eventually")


def test_the_old_objective_options_of_the_strategy_say_where_they_moved():
    with pytest.raises(
        ConfigError,
        match=r"estimator='rloo': the objective moved to the LightningModule.*"
        r"--model.objective.estimator",
    ):
        ThunderSyncStrategy(mode="sync", estimator="rloo")
    with pytest.raises(ConfigError, match="eps=0.1: the objective moved"):
        ThunderSyncStrategy(eps=0.1)


@pytest.mark.parametrize("value", [0, -5, True])
def test_a_token_cap_below_one_token_is_rejected_with_its_value(value):
    with pytest.raises(ConfigError, match=rf"max_batch_tokens must be >= 1 or None, got {value!r}"):
        ThunderSyncStrategy(max_batch_tokens=value)
    assert ThunderSyncStrategy(max_batch_tokens=1).max_batch_tokens == 1
    assert ThunderSyncStrategy().max_batch_tokens is None


@pytest.mark.parametrize("value", [0, -1, True, 2.0, None, "Auto"])
def test_a_row_wait_below_one_or_not_an_integer_or_auto_is_rejected_with_its_value(value):
    with pytest.raises(
        ConfigError, match=rf"min_batch_trajectories must be an integer >= 1 or 'auto', got {value!r}"
    ):
        ThunderSyncStrategy(min_batch_trajectories=value)
    assert ThunderSyncStrategy().min_batch_trajectories == "auto"
    assert ThunderSyncStrategy(min_batch_trajectories=1).min_batch_trajectories == 1


def test_a_row_wait_above_the_row_cap_is_rejected_naming_both():
    with pytest.raises(ConfigError, match="min_batch_trajectories=9 exceeds max_batch_trajectories=8"):
        ThunderSyncStrategy(min_batch_trajectories=9, max_batch_trajectories=8)
    assert ThunderSyncStrategy(min_batch_trajectories=8, max_batch_trajectories=8).min_batch_trajectories == 8


@pytest.mark.parametrize(
    "option", ["boundary_cutt", "find_unused_parameters", "ddp_comm_hook", "static_graph"]
)
def test_an_unknown_or_ddp_wrapper_option_is_rejected_by_name(option):
    with pytest.raises(ConfigError, match=f"{option}=True is not an option of ThunderSyncStrategy"):
        ThunderSyncStrategy(**{option: True})


def test_gradient_accumulation_is_rejected_because_one_step_is_one_rl_batch():
    trainer = _trainer(accumulate_grad_batches=2)
    with pytest.raises(ConfigError, match="accumulate_grad_batches=2"):
        trainer.fit(GRPOPolicy(config=TOY_MODEL), toy_data())


def test_a_fit_of_zero_steps_is_refused_before_any_engine_or_logger_starts():
    trainer = _trainer(max_steps=0)
    with pytest.raises(ConfigError, match=r"max_steps=0: this fit would run no step"):
        trainer.fit(GRPOPolicy(config=TOY_MODEL), toy_data())


class _NoScores(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)
        self.model_spec = GRPOPolicy(config=TOY_MODEL).model_spec

    def training_step(self, batch, batch_idx):
        return self.layer(torch.ones(2)).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_a_module_without_score_tokens_is_rejected_by_name():
    with pytest.raises(ConfigError, match="score_tokens"):
        _trainer().fit(_NoScores(), toy_data())


class _DroppingEngine:
    """Wraps a real engine and loses the last trajectory of every group (a broken engine)."""

    def __init__(self, inner):
        self.inner = inner

    @property
    def version(self):
        return self.inner.version

    def publish(self, weights, version):
        self.inner.publish(weights, version)

    def rollout(self, request):
        last = {f"{g.group_id}-t{g.size - 1}" for g in request.groups}
        for event in self.inner.rollout(request):
            tid = event.trajectory.trajectory_id if hasattr(event, "trajectory") else event.trajectory_id
            if tid not in last:
                yield event

    def shutdown(self):
        self.inner.shutdown()


class _DroppingConfig:
    sampling = TraceReplayEngineConfig().sampling  # the engine contract: it wraps a trace replay
    footprint = TraceReplayEngineConfig().footprint

    def build(self, model_spec, tasks):
        return _DroppingEngine(
            TraceReplayEngineConfig(source="lognormal", time_scale_s=1e-4).build(model_spec, tasks)
        )


def test_an_engine_whose_groups_do_not_match_the_group_size_raises_naming_the_trajectories():
    data = RolloutDataModule(
        tasks=toy_data().tasks, engine=_DroppingConfig(), group_size=3, groups_per_step=2
    )
    with pytest.raises(GroupError, match="t2"):
        _trainer().fit(GRPOPolicy(config=TOY_MODEL), data)


def test_non_rollout_batches_are_rejected_with_the_data_module_to_use():
    class Plain(GRPOPolicy):
        def train_dataloader(self):
            return [torch.zeros(1)]

    with pytest.raises(ConfigError, match="RolloutDataModule"):
        _trainer().fit(Plain(config=TOY_MODEL))


def test_the_policy_trains_under_a_stock_strategy_with_fresh_rollouts():
    L.seed_everything(0)
    policy = GRPOPolicy(config=TOY_MODEL)
    before = torch.cat([p.detach().flatten().clone() for p in policy.parameters()])
    data = toy_data()
    _trainer("auto", max_steps=2).fit(policy, data)
    after = torch.cat([p.detach().flatten() for p in policy.parameters()])
    assert not torch.equal(before, after)
