"""A learner process for test_core_restart: starts a vLLM engine with worker processes, then waits.

``python -m tests.rollout.vllm.orphan_vllm_learner``: prints ``PIDS <learner pid> <descendant pid> ...`` (the
engine core and everything else this process started) once weights are published, then blocks on
stdin, so only the parent-death mechanisms can end its engine core when this process is killed.
"""

from __future__ import annotations

import os
import sys

import psutil

if __name__ == "__main__":
    from tests.rollout.vllm.tasks import TEMPERATURE, TINY_QWEN3, TurnTasks, make_learner
    from thundersync_lightning.rollout import VLLMEngineConfig

    config = VLLMEngineConfig(
        temperature=TEMPERATURE, kv_cache_memory_bytes=64 << 20, max_model_len=128, multiprocessing=True
    )
    engine = config.build(TINY_QWEN3, TurnTasks())
    engine.publish(make_learner(1).state_dict(), 0)
    assert engine.engine_core_pids
    descendants = [p.pid for p in psutil.Process().children(recursive=True)]
    print("PIDS", os.getpid(), *descendants, flush=True)
    sys.stdin.read()
