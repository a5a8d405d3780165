"""Run as a script (vLLM worker processes re-import it): a multiprocessing engine with "file"
weight sync and a distillation teacher in its own engine process, the GPU set-up, checked against
transformers. Prints one JSON line."""

from __future__ import annotations

import json
import sys
import tempfile


def main() -> None:
    from tests.rollout.vllm.tasks import TEMPERATURE, TINY_QWEN3, TurnTasks, make_learner, reference_logprobs
    from tests.rollout.vllm.test_engine import request
    from thundersync_lightning.core.errors import EngineError
    from thundersync_lightning.core.types import ContentReady
    from thundersync_lightning.rollout import TeacherConfig, TeacherScorer
    from thundersync_lightning.rollout.vllm.config import VLLMEngineConfig

    teacher_dir = tempfile.mkdtemp(prefix="thundersync-teacher-")
    make_learner(3).save_pretrained(teacher_dir)
    teacher = TeacherConfig(pretrained_path=teacher_dir)
    config = VLLMEngineConfig(
        temperature=TEMPERATURE,
        kv_cache_memory_bytes=64 << 20,
        max_model_len=128,
        multiprocessing=True,
        weight_sync="file",
        teacher=teacher,
    )
    scorer = TeacherScorer.from_config(teacher, TEMPERATURE)
    result: dict = {}
    with config.build(TINY_QWEN3, TurnTasks()) as engine:
        try:
            engine.rollout(request(0, {0: 1}))
            result["refused_before_publish"] = False
        except EngineError:
            result["refused_before_publish"] = True
        for version, seed in enumerate((1, 2)):
            model = make_learner(seed)
            engine.publish(model.state_dict(), version)
            result[f"publish_seconds_v{version}"] = engine.last_publish_seconds
            trajs = [
                e.trajectory for e in engine.rollout(request(0, {0: 3, 1: 2})) if isinstance(e, ContentReady)
            ]
            err = max(
                abs(a - b) for t in trajs for a, b in zip(reference_logprobs(model, t), t.sampling_logprobs)
            )
            result[f"max_logprob_error_v{version}"] = err
            result[f"max_teacher_error_v{version}"] = max(
                abs(a - b) for t in trajs for a, b in zip(scorer(t).teacher_logprobs, t.teacher_logprobs)
            )
            result[f"versions_v{version}"] = sorted({t.policy_version for t in trajs})
            result[f"tokens_v{version}"] = [t.tokens for t in trajs]
    print("RESULT " + json.dumps(result), flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
