"""Readable by default: the trajectory log decodes every task source's ids through its tokenizer
(tool-calling tasks, DatasetTasks with or without a chat template), calls, results and reasoning
shown, and a truncated action is said to be one."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tests.callbacks.helpers import record
from tests.envs.qwen_style import save_tokenizer
from thundersync_lightning.callbacks.trajectories import decode_trajectory, decoder_for, format_trajectory
from thundersync_lightning.core.types import Segment
from thundersync_lightning.envs.branches import BranchTasks
from thundersync_lightning.envs.datasets import DatasetTasks


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tok")
    save_tokenizer(str(path))
    return str(path)


def rows(tmp_path):
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "2+2=", "answer": "4"}) + "\n")
    return str(data)


def sources(kind, tokenizer_dir, tmp_path):
    if kind == "tools":
        return BranchTasks(tokenizer_path=tokenizer_dir)
    return DatasetTasks(path=rows(tmp_path), fields={"answer": "answer"}, tokenizer_path=tokenizer_dir,
                        use_chat_template=kind == "dataset-chat")  # fmt: skip


@pytest.mark.parametrize("kind", ["tools", "dataset-chat", "dataset-plain"])
def test_a_tool_call_with_reasoning_and_its_result_read_as_text_in_the_log(kind, tokenizer_dir, tmp_path):
    decode = decoder_for(sources(kind, tokenizer_dir, tmp_path))
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    action = (
        '<think>\nplan\n</think>\n\n<tool_call>\n{"name": "delete_branch", "arguments": {"name": "docs"}}\n'
        "</tool_call><|im_end|>"
    )
    result = "\n<|im_start|>user\n<tool_response>\nDeleted branch 'docs'\n</tool_response><|im_end|>\n"
    base = record(0, turns=1)
    traj = replace(base, prompt=tuple(tok.encode("<|im_start|>user\nRemove docs.<|im_end|>\n")),
                   segments=(Segment(tuple(tok.encode(action)), True),
                             Segment(tuple(tok.encode(result)), False)))  # fmt: skip
    entry = decode_trajectory(traj, decode, step=0)
    assert entry["prompt"] == "<|im_start|>user\nRemove docs.<|im_end|>\n"
    assert entry["turns"] == [{"action": action, "observation": result}]  # the end of turn shows


def test_a_truncated_action_is_named_in_the_printed_trajectory():
    entry = decode_trajectory(replace(record(0, turns=1), truncated_actions=1), lambda ids: "x", step=0)
    assert "truncated actions 1 (the token budget ended them, not the model)" in format_trajectory(entry)
