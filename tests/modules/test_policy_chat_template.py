"""Bring your own model: GRPOPolicy(pretrained_path=...) with the tokenizer's chat template, rendered
by one ChatRenderer in the environment (engine side) and the learner; all offline, in a temp dir."""

from __future__ import annotations

import json

import pytest
import torch

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.types import ContentReady, GroupRequest, RewardReady, RolloutRequest
from thundersync_lightning.envs.datasets import DatasetTasks
from thundersync_lightning.modules import GRPOPolicy
from thundersync_lightning.rollout.agent.env_pool import EnvPool
from thundersync_lightning.rollout.agent.loop import AgentLoop, Generation

TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)
WORDS = [
    "[PAD]",
    "[UNK]",
    "<|im_start|>",
    "<|im_end|>",
    "system",
    "user",
    "assistant",
    "what",
    "is",
    "two",
    "plus",
    "four",
    "five",
    "Incorrect.",
    "Try",
    "again.",
    "Be",
    "brief.",
]


def save_model(path, template: str | None = TEMPLATE) -> None:  # noqa: ANN001
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
    )
    if template is not None:
        fast.chat_template = template
    fast.save_pretrained(str(path))
    torch.manual_seed(0)
    Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(WORDS),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            head_dim=64,
            max_position_embeddings=128,
        )
    ).save_pretrained(str(path))


def test_environment_and_learner_render_a_multi_turn_conversation_identically(tmp_path) -> None:  # noqa: ANN001
    model_dir = tmp_path / "model"
    save_model(model_dir)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"q": "what is two plus two", "a": "four"}) + "\n")
    tasks = DatasetTasks(
        str(data),
        fields={"prompt": "q", "answer": "a"},
        reward="exact_match",
        max_turns=3,
        system_prompt="Be brief.",
        tokenizer_path=str(model_dir),
        val_fraction=0.0,
    )
    policy = GRPOPolicy(pretrained_path=str(model_dir))
    chat = policy.chat_renderer
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "what is two plus two"},
    ]
    replies = ["five", "four"]  # wrong, then right: two turns, feedback in between
    scripted = iter(
        [
            chat.assistant_ids(history, replies[0]),
            chat.assistant_ids(
                [
                    *history,
                    {"role": "assistant", "content": "five"},
                    {"role": "user", "content": "Incorrect. Try again."},
                ],
                replies[1],
            ),
        ]
    )

    def generate(requests):  # noqa: ANN001, ANN202
        return [Generation(tuple(ids), (0.0,) * len(ids)) for ids in (next(scripted) for _ in requests)]

    events: list = []
    pool = EnvPool(2, name="test-chat")
    try:
        AgentLoop(tasks, generate, pool, coalesce_s=0).run(
            RolloutRequest(0, (GroupRequest("g", 0, tasks.rows[0], 1),), 0), 0, events.append
        ).wait(30)
    finally:
        pool.shutdown()
    traj = next(e.trajectory for e in events if isinstance(e, ContentReady))
    reward = next(e for e in events if isinstance(e, RewardReady))
    assert (reward.reward, reward.failure, traj.num_turns) == (1.0, None, 2)
    conversation = [
        *history,
        {"role": "assistant", "content": "five"},
        {"role": "user", "content": "Incorrect. Try again."},
        {"role": "assistant", "content": "four"},
    ]
    assert list(traj.tokens) == policy.render_chat(conversation).tolist()
    # The learner scores exactly those ids with the pretrained weights.
    scores = policy.score_tokens([traj])
    assert scores.mask.sum().item() == sum(len(s.tokens) for s in traj.segments if s.scored)
    assert torch.isfinite(scores.logprobs[scores.mask]).all()


def test_a_tokenizer_without_a_chat_template_is_a_config_error(tmp_path) -> None:  # noqa: ANN001
    save_model(tmp_path / "plain", template=None)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "what is two plus two", "answer": "four"}) + "\n")
    with pytest.raises(ConfigError, match="no chat template"):
        DatasetTasks(str(data), reward="exact_match", tokenizer_path=str(tmp_path / "plain"))
    with pytest.raises(ConfigError, match="no chat template"):
        _ = GRPOPolicy(pretrained_path=str(tmp_path / "plain")).chat_renderer
    # Rendering without a template is an explicit choice: plain tokenizer text.
    plain = DatasetTasks(
        str(data), reward="exact_match", tokenizer_path=str(tmp_path / "plain"), use_chat_template=False
    )
    assert plain.make_env(plain.rows[0], 0).reset() == (7, 8, 9, 10, 9)
