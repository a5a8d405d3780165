"""The extension contract (docs/custom.md): every problem of a custom module or task source is
reported at set-up, before any engine starts, in one ConfigError."""

from __future__ import annotations

import lightning as L
import pytest
import torch
from lightning.pytorch import LightningModule

from thundersync_lightning.core.contract import (
    MODULE_CONTRACT,
    check_module,
    check_tasks,
)
from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.types import StepResult
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule

from ._fit import TOY_MODEL


class _Bare(LightningModule):
    """A LightningModule with none of the members the strategy needs."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 2)

    def training_step(self, batch, batch_idx):
        return self.layer(torch.ones(2)).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _NoVerdictEnv:
    def reset(self):
        return (1,)

    def step(self, action):
        return StepResult.of(action, True)

    def close(self):
        pass


class _NoVerdictTasks:
    """A task source whose environments cannot be judged and which lacks ``max_turns``."""

    max_action_tokens = 4
    stop_token = None

    def tasks(self, step, num_groups, seed):
        return list(range(num_groups))

    def make_env(self, task, seed):  # no annotation: the check builds one environment
        return _NoVerdictEnv()


class _RecordingEngineConfig:
    """An engine factory that records whether it was asked to start (it must not be)."""

    def __init__(self) -> None:
        self.built = 0

    def build(self, model_spec, tasks):
        self.built += 1
        raise AssertionError("the engine must not start before the contract check")


def test_every_contract_violation_of_module_and_tasks_is_reported_in_one_error_before_the_engine_starts():
    engine = _RecordingEngineConfig()
    data = RolloutDataModule(
        tasks=GuessingGameTasks(latency="none"), engine=engine, group_size=2, groups_per_step=1
    )
    data.tasks = _NoVerdictTasks()  # as a config could hand over a partial task source
    trainer = L.Trainer(
        strategy="thundersync", accelerator="cpu", devices=1, max_steps=1, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        trainer.fit(_Bare(), data)
    message = str(caught.value)
    for name in (
        "score_tokens",
        "model_spec",
        "weights_for_engine",
        "max_turns",
        "verdict",
        "sampling",
        "footprint",
    ):
        assert f"`{name}`" in message, name
    assert engine.built == 0


def test_every_mode_requires_the_same_module_members():
    for mode in ("streaming", "sync", "async"):
        assert [m.name for m in MODULE_CONTRACT if mode in m.modes] == [
            "score_tokens", "model_spec", "weights_for_engine",
        ]  # fmt: skip
        assert len(check_module(_Bare(), mode=mode)) == 3


def test_the_shipped_policy_and_toy_task_fit_the_contract():
    assert check_module(GRPOPolicy(config=TOY_MODEL)) == []
    assert check_tasks(GuessingGameTasks()) == []


def test_malformed_members_are_named_with_what_they_should_be():
    class Odd(_NoVerdictTasks):
        max_turns = 0
        stop_token = "eos"

        def tasks(self, step):  # one argument short
            return [0]

    problems = check_tasks(Odd())
    assert any("max_turns is 0" in p for p in problems)
    assert any("stop_token is 'eos'" in p for p in problems)
    assert any("tasks(step)" in p and "3 argument" in p for p in problems)


def test_the_environment_is_checked_through_make_envs_annotation_without_building_one():
    class Annotated(_NoVerdictTasks):
        max_turns = 2

        def tasks(self, step, num_groups, seed):
            raise AssertionError("not called: the annotation names the environment class")

        def make_env(self, task, seed) -> _NoVerdictEnv:
            raise AssertionError("not called")

    (problem,) = check_tasks(Annotated())
    assert "_NoVerdictEnv" in problem and "`verdict`" in problem


def test_a_group_size_of_one_warns_that_the_loss_is_exactly_zero():
    with pytest.warns(UserWarning, match="group_size=1.*exactly 0"):
        RolloutDataModule(tasks=GuessingGameTasks(), engine=_RecordingEngineConfig(), group_size=1)
