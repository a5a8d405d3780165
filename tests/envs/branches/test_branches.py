"""Branch requests (envs/branches): the split, the tools, the verdict, and episodes driven by
scripted calls through the demo's own tokenizer and chat template."""

from __future__ import annotations

import functools
import json
import random
import tempfile

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.envs.branches import (
    BRANCHES,
    VERBS,
    BranchTask,
    BranchTasks,
    all_branch_tasks,
    expected_state,
    is_held_out,
)
from thundersync_lightning.envs.branches.start import FormatExamples, call_text, save_tokenizer


@functools.cache
def tokenizer_dir() -> str:
    directory = tempfile.mkdtemp(prefix="branch-tokenizer-")
    save_tokenizer(directory)
    return directory


def source(**kwargs) -> BranchTasks:
    return BranchTasks(tokenizer_dir(), **kwargs)


def act(tasks: BranchTasks, env, text: str):
    """The tokens the engine would sample for an assistant turn writing ``text``, then the step."""
    ids = tasks.renderer.assistant_ids([{"role": "user", "content": "x"}], text)
    return env.step(ids)


def task_of(tasks: BranchTasks, verb: str) -> BranchTask:
    return next(t for t in tasks.train_tasks if t.verb == verb)


def test_the_split_holds_out_whole_pairs_and_trains_on_every_verb_and_every_branch():
    tasks = source()
    train = {(t.verb, t.name) for t in tasks.train_tasks}
    held = {(t.verb, t.name) for t in tasks.validation_tasks()}
    assert held and not (train & held)
    assert len(train | held) == len(VERBS) * len(BRANCHES)
    assert {v for v, _ in train} == set(VERBS) and {b for _, b in train} == set(BRANCHES)
    assert all(is_held_out(t) for t in tasks.validation_tasks())
    assert len(tasks.tasks(0, 100, 0)) == 100 and all(not is_held_out(t) for t in tasks.tasks(3, 40, 0))


def test_every_task_can_be_served_by_its_one_call():
    for task in all_branch_tasks():
        if task.verb == "create":
            assert task.name not in task.branches
        else:
            assert task.name in task.branches and task.name != "main"
        assert expected_state(task) != (frozenset(task.branches), "main")


@pytest.mark.parametrize("verb", VERBS)
def test_the_requested_call_ends_the_episode_with_reward_one(verb):
    tasks = source()
    task = task_of(tasks, verb)
    env = tasks.make_env(task, 0)
    prompt = env.reset()
    assert tasks.renderer.decode(prompt).count(task.request) == 1
    result = act(tasks, env, call_text(f"{verb}_branch", task.name))
    assert result.done and result.tool_calls == 1 and result.invalid_tool_calls == 0
    assert env.verdict() == 1.0


def test_a_valid_call_of_the_wrong_tool_ends_the_episode_with_reward_zero():
    tasks = source()
    task = task_of(tasks, "switch")  # the branch exists and is not current: delete applies
    env = tasks.make_env(task, 0)
    env.reset()
    assert act(tasks, env, call_text("delete_branch", task.name)).done
    assert env.verdict() == 0.0


def test_a_call_that_cannot_apply_answers_an_error_and_the_next_call_may_still_succeed():
    tasks = source()
    task = task_of(tasks, "create")  # the branch does not exist yet
    env = tasks.make_env(task, 0)
    env.reset()
    first = act(tasks, env, call_text("switch_branch", task.name))
    assert not first.done and first.invalid_tool_calls == 0
    assert f"error: no branch named '{task.name}'" in tasks.renderer.decode(first.observation)
    assert act(tasks, env, call_text("create_branch", task.name)).done
    assert env.verdict() == 1.0


@pytest.mark.parametrize(
    "text, reason",
    [
        ("<tool_call>\n{not json}\n</tool_call>", "not valid JSON"),
        (call_text("rename_branch", "docs"), "unknown tool"),
        (
            '<tool_call>\n{"name": "delete_branch", "arguments": {"branch": "docs"}}\n</tool_call>',
            "is a required property",
        ),
        ("Done.", "No tool call found"),
    ],
)
def test_a_malformed_call_or_none_is_a_message_to_the_model_never_a_reward(text, reason):
    tasks = source()
    env = tasks.make_env(task_of(tasks, "delete"), 0)
    env.reset()
    result = act(tasks, env, text)
    assert not result.done and reason in tasks.renderer.decode(result.observation)
    assert result.invalid_tool_calls == (0 if reason == "No tool call found" else 1)
    assert env.verdict() == 0.0


def test_the_format_examples_are_the_tokens_of_the_rendered_conversation_and_target_only_the_calls():
    tasks = source()
    examples = FormatExamples(tasks.renderer)
    rng = random.Random(0)
    for _ in range(20):
        ids, targets = examples.sample(rng, "Remove the docs branch.")
        text = tasks.renderer.decode([i for i, t in zip(ids, targets) if t])
        calls = [json.loads(c.split("\n")[1]) for c in text.split("<tool_call>")[1:]]
        assert 1 <= len(calls) <= 3
        assert all(
            c["name"] in {f"{v}_branch" for v in VERBS} and c["arguments"]["name"] in BRANCHES for c in calls
        )
        assert sum(1 for i, t in zip(ids, targets) if t and i == tasks.renderer.end_of_turn) == len(calls)


def test_a_branch_name_is_one_token_in_requests_and_calls():
    tasks = source()
    tok = tasks.renderer.tokenizer
    for task in all_branch_tasks()[:24]:
        assert tok.convert_tokens_to_ids(task.name) in tasks.renderer.encode(task.request)
        assert tok.convert_tokens_to_ids(task.name) in tasks.renderer.assistant_ids(
            [{"role": "user", "content": "x"}], call_text("switch_branch", task.name)
        )


def test_options_are_checked_together():
    with pytest.raises(ConfigError, match="max_turns=0.*holdout_every=1"):
        source(max_turns=0, holdout_every=1)


@pytest.mark.parametrize("copy_name", [0.0, 1.0])
def test_format_examples_name_the_requests_branch_as_often_as_copy_name_says(copy_name):
    tasks = source()
    examples = FormatExamples(tasks.renderer, copy_name=copy_name)
    rng = random.Random(0)
    named, tools = [], set()
    for task in tasks.train_tasks[:40]:
        ids, targets = examples.sample(rng, task.request, task.name)
        text = tasks.renderer.decode([i for i, t in zip(ids, targets) if t])
        calls = [json.loads(c.split("\n")[1]) for c in text.split("<tool_call>")[1:]]
        named += [c["arguments"]["name"] == task.name for c in calls]
        tools |= {c["name"] for c in calls}
    assert tools == {f"{v}_branch" for v in VERBS}  # the tool stays uniform, whatever the request
    if copy_name == 1.0:
        assert all(named)
    else:
        assert 0.1 < sum(named) / len(named) < 0.45  # chance: 1/4


def test_copy_name_and_prefer_tool_are_probabilities():
    with pytest.raises(ValueError, match="copy_name=1.5, prefer_tool=-0.1"):
        FormatExamples(source().renderer, copy_name=1.5, prefer_tool=-0.1)


def test_prefer_tool_one_makes_every_call_the_requested_tool():
    tasks = source()
    examples = FormatExamples(tasks.renderer, prefer_tool=1.0)
    rng = random.Random(0)
    for task in tasks.train_tasks[:24]:
        ids, targets = examples.sample(rng, task.request, task.name, f"{task.verb}_branch")
        text = tasks.renderer.decode([i for i, t in zip(ids, targets) if t])
        assert {json.loads(c.split("\n")[1])["name"] for c in text.split("<tool_call>")[1:]} == {
            f"{task.verb}_branch"
        }
