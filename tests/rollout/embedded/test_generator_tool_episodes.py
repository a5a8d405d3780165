"""Tool-call episodes with a real sampler (the embedded engine's generator) over a pretrained
directory with a Qwen3-style chat template: the learner's logprobs of the episode's context
equal the engine's, turn after turn of rendered tool results."""

from __future__ import annotations

import tempfile

import torch

from tests.envs.qwen_style import save_model
from tests.envs.tools.test_tools_calls import ScriptedToolTasks
from thundersync_lightning.envs.chat import ChatRenderer
from thundersync_lightning.rollout import AgentLoop, EnvPool, HFGenerator, make_request

from ..helpers import collect, learner_logprobs


def test_a_sampled_tool_episode_is_scored_by_the_learner_with_the_engine_logprobs():
    from transformers import AutoModelForCausalLM

    directory = tempfile.mkdtemp(prefix="qwen-style-model-")
    save_model(directory)
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    renderer = ChatRenderer(directory, template_kwargs={"enable_thinking": True})
    tasks = ScriptedToolTasks(renderer, ["out <tool_call>", "<|im_end|>"], max_turns=3, max_action_tokens=24)
    pool = EnvPool(2, name="test-tool-episodes")
    events: list = []
    try:
        loop = AgentLoop(tasks, HFGenerator(model, temperature=0.9), pool)
        assert loop.run(
            make_request(tasks, step=0, num_groups=2, group_size=3, seed=1), 0, events.append
        ).wait(60)
    finally:
        pool.shutdown()
    trajs, rewards, _ = collect(events)
    assert len(trajs) == 6 and all(r.failure is None for r in rewards.values())
    assert sum(t.num_turns for t in trajs.values()) > 6  # rendered tool results / reminders in context
    for t in trajs.values():
        assert t.num_turns >= 1 and len(t.prompt) > 0
        with torch.no_grad():
            learner = learner_logprobs(model, t, temperature=0.9)
        assert (learner - torch.tensor(t.sampling_logprobs)).abs().max() <= 1e-4
        assert len(learner) == t.num_scored_tokens
