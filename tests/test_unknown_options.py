"""Every public constructor rejects an unknown keyword with a ConfigError that names it.

A misspelt option that is silently accepted runs as if it were not given (issue 12). Python's own
TypeError is not enough: the error must be thundersync's ConfigError, naming the option.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.envs.toy import GuessingGameTasks
from thundersync_lightning.rollout import (
    EmbeddedEngineConfig,
    EnginePoolConfig,
    TeacherConfig,
    TraceReplayEngineConfig,
)
from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig


def _strategy(**kw: Any) -> Any:
    from thundersync_lightning.strategy import ThunderSyncStrategy

    return ThunderSyncStrategy(**kw)


def _policy(**kw: Any) -> Any:
    from thundersync_lightning.modules import GRPOPolicy

    return GRPOPolicy(**kw)


def _data(**kw: Any) -> Any:
    from thundersync_lightning.modules import RolloutDataModule

    return RolloutDataModule(tasks=GuessingGameTasks(latency="none"), engine=EmbeddedEngineConfig(), **kw)


def _pool(**kw: Any) -> Any:
    return EnginePoolConfig(engine=EmbeddedEngineConfig(), **kw)


def _code_tasks(**kw: Any) -> Any:
    from thundersync_lightning.envs.code import LocalCodeTasks

    return LocalCodeTasks(**kw)


def _dataset_tasks(**kw: Any) -> Any:
    from thundersync_lightning.envs.datasets import DatasetTasks

    return DatasetTasks([{"prompt": "p", "answer": "1"}], **kw)


def _swebench_tasks(**kw: Any) -> Any:
    from thundersync_lightning.envs.swebench.source import SWEbenchTasks

    return SWEbenchTasks(instances="instances.jsonl", **kw)


CONSTRUCTORS: list[Any] = [
    pytest.param(_strategy, id="ThunderSyncStrategy"),
    pytest.param(_policy, id="GRPOPolicy"),
    pytest.param(_data, id="RolloutDataModule"),
    pytest.param(EmbeddedEngineConfig, id="EmbeddedEngineConfig"),
    pytest.param(TraceReplayEngineConfig, id="TraceReplayEngineConfig"),
    pytest.param(VLLMEngineConfig, id="VLLMEngineConfig"),
    pytest.param(_pool, id="EnginePoolConfig"),
    pytest.param(GuessingGameTasks, id="GuessingGameTasks"),
    pytest.param(_code_tasks, id="LocalCodeTasks"),
    pytest.param(_swebench_tasks, id="SWEbenchTasks"),
    pytest.param(_dataset_tasks, id="DatasetTasks"),
]


@pytest.mark.parametrize("build", CONSTRUCTORS)
def test_an_unknown_option_raises_a_config_error_naming_it(build: Callable[..., Any]):
    with pytest.raises(ConfigError, match="not_an_option"):
        build(not_an_option=1)


def test_a_misspelt_option_is_answered_with_the_closest_valid_name():
    with pytest.raises(ConfigError, match=r"'temprature' \(did you mean 'temperature'\?\)"):
        EmbeddedEngineConfig(temprature=0.7)


@pytest.mark.parametrize(
    ("build", "name", "counterpart"),
    [
        (_data, "num_generations", "data.group_size"),
        (
            _dataset_tasks,
            "max_completion_length",
            "data.tasks (DatasetTasks).max_action_tokens, a limit per turn",
        ),
        (
            _dataset_tasks,
            "max_tool_calling_iterations",
            "data.tasks (DatasetTasks).max_turns, which is max_tool_calling_iterations + 1",
        ),
        (_dataset_tasks, "chat_template_kwargs", "data.tasks (DatasetTasks).template_kwargs"),
        (_policy, "peft_config", "model.lora"),
        (_policy, "beta", "model.objective.kl_coef"),
        (_policy, "loss_type", "model.objective.loss_agg"),
        (_policy, "scale_rewards", "model.objective.scale"),
        (_strategy, "report_to", "trainer.logger"),
        (_strategy, "log_completions", "trainer.callbacks: thundersync_lightning.callbacks.TrajectoryLogger"),
    ],
)
def test_a_trl_option_name_is_answered_with_its_counterpart(
    build: Callable[..., Any], name: str, counterpart: str
):
    with pytest.raises(ConfigError) as err:
        build(**{name: 1})
    assert name in str(err.value) and f"TRL's GRPOConfig name; here: {counterpart}" in str(err.value)


def test_strict_constructors_keep_their_signature_for_yaml_and_the_cli():
    assert "max_engine_restarts" in inspect.signature(EmbeddedEngineConfig).parameters
    assert "latency_sigma" in inspect.signature(GuessingGameTasks).parameters
    assert EmbeddedEngineConfig(temperature=0.5).temperature == 0.5


def test_vllm_options_that_the_chosen_mode_ignores_are_rejected():
    with pytest.raises(
        ConfigError,
        match=r"gpu_memory_utilization=0.9 has no effect while kv_cache_memory_bytes is "
        r"set \(leave it at its default 0.5\)",
    ):
        VLLMEngineConfig(gpu_memory_utilization=0.9)
    # null (a YAML override) is refused with the range, not a TypeError
    with pytest.raises(ConfigError, match=r"gpu_memory_utilization must be in \(0, 1\], got None"):
        VLLMEngineConfig(gpu_memory_utilization=None)
    with pytest.raises(ConfigError, match="weights_dir='/tmp' has no effect with weight_sync='direct'"):
        VLLMEngineConfig(weight_sync="direct", weights_dir="/tmp")
    with pytest.raises(
        ConfigError,
        match=r"weights_dir='/tmp' has no effect with weight_sync='auto' and multiprocessing=False",
    ):
        VLLMEngineConfig(weights_dir="/tmp")
    with pytest.raises(ConfigError, match="weights_dir='/tmp' has no effect with weight_sync='nccl'"):
        VLLMEngineConfig(multiprocessing=True, weight_sync="nccl", weights_dir="/tmp")
    with pytest.raises(
        ConfigError, match="weight_sync_bucket_bytes=1024 has no effect with weight_sync='file'"
    ):
        VLLMEngineConfig(multiprocessing=True, weight_sync="file", weight_sync_bucket_bytes=1024)
    assert (
        VLLMEngineConfig(multiprocessing=True, weights_dir="/tmp").weights_dir == "/tmp"
    )  # auto may mean file
    assert (
        VLLMEngineConfig(multiprocessing=True, weight_sync="ipc", weight_sync_bucket_bytes=1024).weight_sync
        == "ipc"
    )
    assert (
        VLLMEngineConfig(kv_cache_memory_bytes=None, gpu_memory_utilization=0.9).gpu_memory_utilization == 0.9
    )
    with pytest.raises(
        ConfigError,
        match=r"teacher_engine_kwargs=\{'gpu_memory_utilization': 0.2\} has no effect without a teacher",
    ):
        VLLMEngineConfig(teacher_engine_kwargs={"gpu_memory_utilization": 0.2})
    with pytest.raises(ConfigError, match="teacher must be a TeacherConfig or None, got dict"):
        VLLMEngineConfig(teacher={"ckpt_path": "last.ckpt"})  # type: ignore[arg-type]
    teacher = TeacherConfig(ckpt_path="last.ckpt")
    assert VLLMEngineConfig(teacher=teacher, teacher_engine_kwargs={"max_num_seqs": 8}).teacher == teacher


def test_the_strategy_names_max_held_trajectories_among_its_options_and_validates_it():
    with pytest.raises(ConfigError, match="valid options: .*max_held_trajectories"):
        _strategy(max_held=1)
    with pytest.raises(ConfigError, match="max_held_trajectories must be >= 0"):
        _strategy(max_held_trajectories=-1)
    assert _strategy(max_held_trajectories=0).max_held_trajectories == 0
    assert "max_held_trajectories" in inspect.signature(_strategy_class()).parameters


def _strategy_class() -> Any:
    from thundersync_lightning.strategy import ThunderSyncStrategy

    return ThunderSyncStrategy


def test_the_strategy_lists_every_option_of_its_own_when_rejecting_an_unknown_one():
    from thundersync_lightning.strategy import ThunderSyncStrategy

    params = list(inspect.signature(ThunderSyncStrategy).parameters)
    own = params[: params.index("accelerator")]  # the rest is Lightning's plumbing
    with pytest.raises(ConfigError) as err:
        ThunderSyncStrategy(not_an_option=1)
    assert [name for name in own if name not in str(err.value)] == []
