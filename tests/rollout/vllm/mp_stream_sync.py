"""Run as a script (vLLM worker processes re-import it): multiprocessing engines with the bucketed
weight transports on CPU ("nccl" over gloo, "ipc" through the shared-file stand-in), checked
against transformers after each publish, and a publish that fails half-way. Prints one JSON line."""

from __future__ import annotations

import json
import sys

import torch


def main(transports: list[str]) -> None:
    from tests.rollout.vllm.tasks import TEMPERATURE, TINY_QWEN3, TurnTasks, make_learner, reference_logprobs
    from tests.rollout.vllm.test_engine import request
    from thundersync_lightning.core.errors import EngineError
    from thundersync_lightning.core.types import ContentReady
    from thundersync_lightning.rollout import VLLMEngineConfig

    def max_error(engine, model, step: int) -> float:
        events = engine.rollout(request(step, {0: 3, 1: 2}))
        trajs = [e.trajectory for e in events if isinstance(e, ContentReady)]
        assert {t.policy_version for t in trajs} == {engine.version}
        return max(
            abs(a - b) for t in trajs for a, b in zip(reference_logprobs(model, t), t.sampling_logprobs)
        )

    result: dict = {}
    for transport in transports:
        config = VLLMEngineConfig(
            temperature=TEMPERATURE,
            kv_cache_memory_bytes=64 << 20,
            max_model_len=128,
            multiprocessing=True,
            weight_sync=transport,
            weight_sync_bucket_bytes=16 << 10,  # 16 KiB: the tiny model travels in several buckets
        )
        row: dict = {}
        with config.build(TINY_QWEN3, TurnTasks()) as engine:
            row["weight_sync"] = engine.weight_sync
            first, second = make_learner(1), make_learner(2)
            engine.publish(first.state_dict(), 0)
            row["error_v0"] = max_error(engine, first, 0)
            weights = dict(second.state_dict())  # the final norm sits in a late bucket
            weights["model.norm.weight"] = torch.empty(weights["model.norm.weight"].shape, device="meta")
            try:
                engine.publish(weights, 1)
                row["half_way"] = "published"
            except EngineError as exc:
                row["half_way"] = str(exc)
            try:
                engine.rollout(request(1, {0: 1}))
                row["refused_after_half_way"] = ""
            except EngineError as exc:
                row["refused_after_half_way"] = str(exc)
            engine.publish(second.state_dict(), 1)
            row["error_v1"] = max_error(engine, second, 1)
            row["publish_seconds"] = engine.last_publish_seconds
        result[transport] = row
    print("RESULT " + json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main(sys.argv[1:] or ["nccl", "ipc"])
