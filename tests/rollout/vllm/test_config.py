"""VLLMEngineConfig validation and the shipped YAML configs (no engine started)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig

pytestmark = pytest.mark.vllm

CONFIGS = Path(__file__).resolve().parents[3] / "configs"


def test_every_problem_of_a_config_is_reported_at_once():
    with pytest.raises(ConfigError) as info:
        VLLMEngineConfig(temperature=0.0, max_num_seqs=0, multiprocessing=True, weight_sync="direct")
    message = str(info.value)
    assert "temperature" in message and "max_num_seqs" in message and "multiprocessing=False" in message


def test_an_unknown_weight_sync_is_refused_with_the_valid_choices():
    with pytest.raises(ConfigError, match="'auto', 'direct', 'file', 'ipc', 'nccl'"):
        VLLMEngineConfig(weight_sync="shm")  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["toy_vllm.yaml", "gpu_vllm_example.yaml"])
def test_the_shipped_configs_build_a_valid_engine_config(name):
    config = yaml.safe_load((CONFIGS / name).read_text())
    engine = config["data"]["engine"]
    assert engine["class_path"] == "thundersync_lightning.rollout.VLLMEngineConfig"
    built = VLLMEngineConfig(**engine["init_args"])
    # the sampling temperature's one home is the engine (the module reads it at set-up)
    assert "temperature" not in config["model"] and built.temperature > 0


def test_max_engine_restarts_must_not_be_negative_and_applies_only_to_worker_processes():
    with pytest.raises(ConfigError, match="max_engine_restarts must be >= 0, got -1"):
        VLLMEngineConfig(multiprocessing=True, max_engine_restarts=-1)
    with pytest.raises(ConfigError, match=r"max_engine_restarts=3 has no effect with multiprocessing=False"):
        VLLMEngineConfig(max_engine_restarts=3)
    assert VLLMEngineConfig(multiprocessing=True, max_engine_restarts=0).max_engine_restarts == 0
    assert VLLMEngineConfig().max_engine_restarts == 1  # the default is valid in-process too
