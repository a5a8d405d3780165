"""The memory plan at set-up: read from the live fit, refused before the engine starts, and measured."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import lightning as L
import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.modules import GRPOPolicy, RolloutDataModule
from thundersync_lightning.modules.lora import LoraSettings
from thundersync_lightning.rollout import EmbeddedEngineConfig
from thundersync_lightning.strategy import ThunderSyncStrategy, memory_check

from ._fit import TOY_MODEL, fit, toy_data

ROOT = Path(__file__).resolve().parents[2]


class _EngineThatMustNotStart(EmbeddedEngineConfig):
    def build(self, model_spec, tasks):  # noqa: ANN001, ANN201
        raise AssertionError("the engine started although the memory plan does not fit")


def _strategy(**kw) -> ThunderSyncStrategy:
    strategy = ThunderSyncStrategy(**kw)
    L.Trainer(strategy=strategy, accelerator="cpu", devices=1, logger=False)  # sets its devices
    return strategy


def test_the_planned_bytes_match_the_measured_rss_growth_within_15_percent():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("rss_script.py"))],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    # the accumulator's own accounting hits the planned bound exactly: 2 x 2 sums + 4 held + 1 step gradient
    assert result["accounted_accumulator_peak"] == result["planned_accumulator"] == 9 * 4 * result["params"]
    planned = sum(result["planned"].values())  # weights + gradients + AdamW + accumulator: 13 x 4 P bytes
    assert abs(result["measured_rss_growth"] / planned - 1) <= 0.15, result


def test_the_fit_plan_reads_the_live_module_data_and_strategy():
    policy = GRPOPolicy(config=TOY_MODEL, lora=LoraSettings(r=4))
    trainer = SimpleNamespace(
        lightning_module=policy, datamodule=toy_data(groups=6, group_size=3), precision="32-true"
    )
    plan = memory_check.fit_plan(
        trainer, _strategy(max_open_groups=2, offload="cpu", max_batch_trajectories=5)
    )
    i = plan.inputs
    trainable = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert i.model.trainable_params == trainable < i.model.total_params and i.model.lora
    assert (i.groups_per_step, i.group_size, i.open_groups, i.held_trajectories) == (6, 3, 2, 6)
    assert (i.offload, i.max_batch_trajectories, i.accelerator, i.optimizer) == ("cpu", 5, "cpu", "adamw")
    assert (i.sharding, i.max_held_trajectories) == ("none", None)  # options of other parts, absent here
    # the task source bounds an episode (start token + 4 turns of a guess and an answer)
    assert i.max_tokens_per_trajectory == toy_data().tasks.max_episode_tokens() == 9 and i.tokens_bounded
    # held unbounded: at most G buffers per open group (sums and held), on the pageable host
    assert plan.row("group sums").pageable_host + plan.row("held gradients").pageable_host == (
        2 * i.group_size * trainable * 4
    )


def test_the_fit_plan_reads_the_token_cap_and_the_policys_padding_rule():
    policy = GRPOPolicy(config=TOY_MODEL, score_max_padding=0.5, score_forward_tokens=3)
    trainer = SimpleNamespace(lightning_module=policy, datamodule=toy_data(), precision="32-true")
    i = memory_check.fit_plan(trainer, _strategy(max_batch_tokens=20)).inputs
    assert (i.max_batch_tokens, i.score_max_padding, i.score_forward_tokens) == (20, 0.5, 3)
    # a module without the padding options: unknown, so the cap cannot shrink the plan
    plain = SimpleNamespace(lightning_module=policy, datamodule=toy_data(), precision="32-true")
    policy.hparams.pop("score_max_padding")
    assert memory_check.fit_plan(plain, _strategy(max_batch_tokens=20)).inputs.score_max_padding is None


def test_the_fit_plan_reads_the_held_bound_and_sharding_when_the_strategy_has_them():
    strategy = _strategy()
    strategy.max_held_trajectories, strategy.sharding = 3, "zero1"
    trainer = SimpleNamespace(
        lightning_module=GRPOPolicy(config=TOY_MODEL), datamodule=toy_data(), precision="bf16-true"
    )
    i = memory_check.fit_plan(trainer, strategy).inputs
    assert (i.max_held_trajectories, i.held_trajectories, i.sharding, i.model.param_bytes) == (
        3,
        3,
        "zero1",
        2,
    )


def test_a_fit_whose_plan_does_not_fit_is_refused_before_the_engine_starts_naming_the_fix(monkeypatch):
    # 24 MiB free: the unbounded plan (4 open groups x 2 sums + 16 held gradients of 0.6 MB, and a split
    # backward call holding up to 17 gradients: 29.6 MiB) does not fit; without the split (20.2 MiB) it would
    monkeypatch.setattr(memory_check, "machine_capacity", lambda device: (24 * 2**20, 24 * 2**20))
    data = RolloutDataModule(
        tasks=toy_data().tasks, engine=_EngineThatMustNotStart(), group_size=4, groups_per_step=4
    )
    trainer = L.Trainer(
        strategy=ThunderSyncStrategy(max_batch_trajectories=32),  # "auto" would take a call that fits
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with pytest.raises(ConfigError) as err:
        trainer.fit(GRPOPolicy(config=TOY_MODEL), data)
    message = str(err.value)
    assert "memory plan does not fit this host" in message
    assert re.search(r"any of these would make it fit: .*trainer\.strategy\.init_args\.max_\w+=\d+", message)
    assert "group sums" in message and "memory_check=warn" in message
    assert "17 x P_t e: the destinations of one split-backward call" in message
    assert "trainer.strategy.init_args.split_backward=false" in message


class _UnboundedTasks(type(toy_data().tasks)):
    """The toy game without its episode bound: only the model's context window bounds T."""

    max_episode_tokens = None  # type: ignore[assignment]


def test_a_plan_bounded_only_by_the_model_context_is_a_worst_case_that_warns_instead_of_refusing(
    monkeypatch, caplog
):
    policy = GRPOPolicy(config=TOY_MODEL)
    data = RolloutDataModule(
        tasks=_UnboundedTasks(latency="none"),
        engine=EmbeddedEngineConfig(num_threads=1),
        group_size=4,
        groups_per_step=4,
    )
    plan = memory_check.fit_plan(
        SimpleNamespace(lightning_module=policy, datamodule=data, precision="32-true"), _strategy()
    )
    assert plan.inputs.max_tokens_per_trajectory == TOY_MODEL["max_position_embeddings"]
    assert not plan.inputs.tokens_bounded and "T unbounded" in plan.table()
    monkeypatch.setattr(memory_check, "machine_capacity", lambda device: (2**20, 2**20))
    with caplog.at_level(logging.WARNING, logger="thundersync_lightning.strategy.setup_checks"):
        problems, certain = memory_check.memory_problems(
            SimpleNamespace(lightning_module=policy, datamodule=data, precision="32-true"), _strategy()
        )
    assert problems and not certain and "max_context_tokens" in problems[0]


def test_memory_check_warn_logs_the_plan_and_trains(monkeypatch, caplog):
    monkeypatch.setattr(memory_check, "machine_capacity", lambda device: (2**20, 2**20))
    with caplog.at_level(logging.WARNING, logger="thundersync_lightning.strategy.setup_checks"):
        _, steps, _ = fit("streaming", steps=1, strategy_kwargs={"memory_check": "warn"})
    assert len(steps) == 1
    assert "memory_check='warn': the learner's memory plan does not fit" in caplog.text


def test_an_unknown_memory_check_value_is_rejected():
    with pytest.raises(ConfigError, match="memory_check='maybe' is not one of"):
        ThunderSyncStrategy(memory_check="maybe")


def test_memory_check_off_neither_plans_nor_refuses_and_error_refuses_what_warn_only_logs(
    monkeypatch, caplog
):
    from thundersync_lightning.strategy import setup_checks

    planned = []
    monkeypatch.setattr(
        setup_checks, "memory_problems", lambda t, s: planned.append(1) or (["too big"], True)
    )
    setup_checks.check_memory(None, None, "off")
    assert planned == []
    with caplog.at_level(logging.WARNING, logger="thundersync_lightning.strategy.setup_checks"):
        setup_checks.check_memory(None, None, "warn")
    assert "too big" in caplog.text
    with pytest.raises(ConfigError, match="too big"):
        setup_checks.check_memory(None, None, "error")
    assert planned == [1, 1]


def test_an_automatic_call_size_is_planned_at_every_trajectory_of_the_step_when_that_fits_this_host():
    policy = GRPOPolicy(config=TOY_MODEL)
    trainer = SimpleNamespace(
        lightning_module=policy, datamodule=toy_data(groups=6, group_size=3), precision="32-true"
    )
    strategy = _strategy()  # max_batch_trajectories="auto", the default
    assert strategy.max_batch_trajectories == "auto" and strategy.call_rows == 32  # before set-up
    assert memory_check.fit_plan(trainer, strategy).inputs.max_batch_trajectories == 18
    assert memory_check.resolve_call_rows(trainer, strategy) == 18
    assert memory_check.resolve_call_rows(trainer, _strategy(max_batch_trajectories=5)) is None
    assert _strategy(max_batch_trajectories=5).call_rows == 5


@pytest.mark.parametrize("rows", [0, "many", 2.5, True])
def test_a_call_size_other_than_a_positive_integer_or_auto_is_refused(rows):
    with pytest.raises(ConfigError, match="max_batch_trajectories must be an integer >= 1 or 'auto'"):
        ThunderSyncStrategy(max_batch_trajectories=rows)


def test_an_automatic_call_size_shrinks_to_a_call_whose_plan_fits_the_machine(monkeypatch):
    # the machine of the refused fit above: a whole-step call (16 rows, 17 split destinations) does
    # not fit 24 MiB, so "auto" takes the largest call that does, and the plan then fits
    monkeypatch.setattr(memory_check, "machine_capacity", lambda device: (24 * 2**20, 24 * 2**20))
    policy = GRPOPolicy(config=TOY_MODEL)
    trainer = SimpleNamespace(
        lightning_module=policy, datamodule=toy_data(groups=4, group_size=4), precision="32-true"
    )
    rows = memory_check.resolve_call_rows(trainer, _strategy())
    assert rows is not None and 1 <= rows < 16
    assert memory_check.memory_problems(trainer, _strategy()) == ([], False)
    assert memory_check.memory_problems(trainer, _strategy(max_batch_trajectories=rows + 1))[0]
