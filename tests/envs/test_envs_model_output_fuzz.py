"""Model output can never raise on the host: random and adversarial actions through every shipped
environment's ``step`` (text actions and native tool calls), none of which may raise.

Before: deeply nested tool-call JSON raised ``RecursionError`` (the parser caught ValueError only,
and a schema-invalid call was kept and rendered recursively), a NUL byte or a lone surrogate in a
bash command made ``Popen`` raise on the host, and the episode ended as an environment failure,
which ``failed="drop"`` removed from its group: a way out of a zero.
"""

from __future__ import annotations

import json
import os
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thundersync_lightning.core.types import StepResult
from thundersync_lightning.envs.branches import BranchTasks
from thundersync_lightning.envs.code import LocalCodeTasks
from thundersync_lightning.envs.datasets import DatasetTasks
from thundersync_lightning.envs.tools import parse_hermes
from thundersync_lightning.envs.toy import GuessingGameTasks

from ._support import needs_bwrap
from .repo.test_tools import model_dir


def _block(body: str) -> str:
    return f"<tool_call>{body}</tool_call>"


def _call(name: str, arguments: object) -> str:
    return _block(json.dumps({"name": name, "arguments": arguments}))


DEEP = "[" * 5000 + "]" * 5000
# What a policy writes to make the host raise: each was an exception out of ``step`` before.
ADVERSARIAL_CALLS = [
    _block('{"name": "bash", "arguments": {"command": ' + DEEP + "}}"),  # RecursionError in the parser
    _block('{"name": "nope", "arguments": {"x": ' + "[" * 900 + "]" * 900 + "}}"),  # rendered recursively
    _block('{"name": "bash", "arguments": ' + '{"a": ' * 3000 + "1" + "}" * 3000 + "}"),
    _block('{"name": "bash", "arguments": "' + "[" * 3000 + "]" * 3000 + '"}'),  # arguments as a JSON string
    _call("bash", {"command": "echo a\u0000b"}),  # NUL byte: Popen raised ValueError on the host
    _block(
        '{"name": "bash", "arguments": {"command": "echo \\ud800"}}'
    ),  # lone surrogate: UnicodeEncodeError
    _call("bash", {"command": "x" * 150_000}),  # past the kernel's argument limit: E2BIG
    _block('{"name": "bash", "arguments": {"command": 1e999}}'),
    _block('{"name": "bash", "arguments": {"command": NaN}}'),
    _block('{"name": "bash", "arguments": {"command": -Infinity}}'),
    _block('{"name": "bash", "arguments": {"command": ' + "9" * 5000 + "}}"),  # past int's digit limit
    _call("bash", {"command": ["ls"]}),
    _call("bash", {"command": None}),
    _call("bash", "ls"),
    _call("bash", [1, 2]),
    _call("str_replace_editor", {"command": "view", "path": "\u0000"}),
    _call("str_replace_editor", {"command": "view", "path": "\udc80x", "view_range": [10**400, -(10**400)]}),
    _call(
        "str_replace_editor",
        {"command": "insert", "path": "a.py", "insert_line": 10**300, "new_str": "\ud800"},
    ),
    _call("str_replace_editor", {"command": "create", "path": "../../etc/x", "file_text": 5}),
    _call("str_replace_editor", {"command": "str_replace", "path": "a.py", "old_str": {"a": 1}}),
    _call("str_replace_editor", {"command": "undo_edit", "path": "\ud800"}),
    _call("switch_branch", {"name": "\u0000\ud800"}),
    _call("delete_branch", {"name": 10**400}),
    _call("create_branch", {"name": {"nested": [[[[]]]]}}),
    _call("submit", {"x": 1}),
    _block('{"name": "\ud800", "arguments": {}}'),
    _block("{" * 100_000),
    _block('{"name": "bash", "arguments": {"command": "echo hi"}}') * 50,  # far past the calls per turn
    "<tool_call>" + "\u0000" * 10,
    "<think>" + _call("bash", {"command": "x\u0000"}) + "</think>\ufffd\ud800",
    "\ue000tsl0\ue001" + _call("bash", {"command": "echo \ue000tsl1\ue001"}),  # the renderer's sentinels
]
ADVERSARIAL_TEXT = [
    "bash echo a\x00b",  # NUL byte through the text action format
    "bash " + "x" * 150_000,
    "write a\x00.py\nx",
    "replace a.py\n<<<<<<< SEARCH\n\x00\n=======\n\ud800\n>>>>>>> REPLACE",
    "write " + "a/" * 5000 + "x.py\ny",
    "submit now",
    "\x00" * 100,
]
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
hostile_text = st.text(alphabet=st.characters(blacklist_categories=()), max_size=300)


def _ids(tokenizer, text: str, stop: int) -> tuple[int, ...]:  # noqa: ANN001
    """What a policy samples to write ``text`` (a raw lone surrogate cannot be sampled: its JSON
    escape, ``\\ud800``, is how one reaches a handler)."""
    return (*tokenizer.encode(text.encode("utf-8", "replace").decode(), add_special_tokens=False), stop)


def _check(result: object, vocab: int | None = None) -> None:
    """What the agent loop relies on of any step's answer, whatever the action was: token ids the
    policy can embed (below ``vocab`` where given), a boolean end, call counts that add up, and an
    observation saying why whenever a call was refused or failed (unless the episode ended)."""
    assert isinstance(result, StepResult)
    assert isinstance(result.done, bool)
    obs = result.observation
    assert isinstance(obs, tuple) and all(type(i) is int and i >= 0 for i in obs)
    if vocab is not None:
        assert max(obs, default=0) < vocab
    assert 0 <= result.invalid_tool_calls <= result.tool_calls
    assert 0 <= result.tool_timeouts <= result.tool_errors <= result.tool_calls
    if result.invalid_tool_calls or result.tool_errors:
        assert obs or result.done


def test_the_parser_turns_any_deep_or_non_finite_json_into_call_errors_without_recursing():
    for text in ADVERSARIAL_CALLS:
        parse_hermes(text)  # no exception
    calls = parse_hermes(ADVERSARIAL_CALLS[0]).calls
    assert len(calls) == 1 and "nests deeper" in calls[0].reason


def test_the_toy_game_answers_any_ids():
    tasks = GuessingGameTasks(latency="none")
    env = tasks.make_env(tasks.tasks(0, 1, 0)[0], 0)
    env.reset()
    for action in [(), (-1,), (10**30,), tuple(range(-5, 300))]:
        _check(env.step(action), tasks.vocab_size)


@pytest.fixture(scope="module")
def branches() -> BranchTasks:
    return BranchTasks(model_dir(), max_turns=100)


def test_the_branch_tools_answer_every_adversarial_call_with_an_error_observation(branches):
    env = branches.make_env(branches.all_tasks[0], 0)
    env.reset()
    for text in ADVERSARIAL_CALLS:
        _check(env.step(_ids(branches.renderer.tokenizer, text, branches.stop_token)))
    deep = env.step(_ids(branches.renderer.tokenizer, ADVERSARIAL_CALLS[0], branches.stop_token))
    assert deep.invalid_tool_calls == 1 and "nests deeper" in branches.renderer.tokenizer.decode(
        deep.observation
    )


@FUZZ
@given(text=hostile_text, ids=st.lists(st.integers(-10, 200_000), max_size=40))
def test_the_branch_tools_answer_random_text_and_random_ids(branches, text, ids):
    env = branches.make_env(branches.all_tasks[0], 0)
    env.reset()
    vocab = len(branches.renderer.tokenizer)
    _check(env.step(_ids(branches.renderer.tokenizer, text, branches.stop_token)), vocab)
    _check(env.step((*ids, branches.stop_token)), vocab)


def test_a_dataset_episode_answers_any_text_with_a_feedback_or_an_end(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "what is 1 + 1?", "answer": "2"}) + "\n")
    for reward in ("exact_match", "math_answer"):
        tasks = DatasetTasks(
            str(path), fields={"answer": "answer"}, reward=reward, max_turns=50, val_fraction=0.0
        )
        env = tasks.make_env(tasks.rows[0], 0)
        env.reset()
        for text in [*ADVERSARIAL_CALLS, *ADVERSARIAL_TEXT, "1e999", "9" * 5000, "\\boxed{" * 3000]:
            _check(env.step((*bytes(text, "utf-8", "surrogatepass"), tasks.stop_token)))


@pytest.fixture(scope="module")
def code_envs():
    """One open code workspace per action format (text with the byte codec, native tool calls)."""
    root = tempfile.mkdtemp(prefix="fuzz-", dir="/tmp")
    made = []
    for fmt in ("text", "tools"):
        extra = {"tokenizer_path": model_dir()} if fmt == "tools" else {}
        tasks = LocalCodeTasks(
            names=["leap_year"],
            sandbox_root=root,
            uid_base=3_960_000,
            uid_count=8,
            action_format=fmt,
            command_timeout_s=10,
            max_turns=1000,
            **extra,
        )
        env = tasks.make_env(tasks.all_tasks[0], 0)
        env.reset()
        made.append((fmt, tasks, env))
    yield {fmt: (tasks, env) for fmt, tasks, env in made}
    for _, _, env in made:
        env.close()
    os.rmdir(root)


def _code_ids(tasks: LocalCodeTasks, text: str) -> tuple[int, ...]:
    if tasks.renderer is not None:
        return _ids(tasks.renderer.tokenizer, text, tasks.stop_token)
    return (*text.encode("utf-8", "surrogatepass"), tasks.stop_token)


@needs_bwrap
@pytest.mark.parametrize("fmt", ["text", "tools"])
def test_a_code_task_answers_every_adversarial_action_with_an_invalid_call_observation(code_envs, fmt):
    tasks, env = code_envs[fmt]
    texts = ADVERSARIAL_CALLS if fmt == "tools" else ADVERSARIAL_TEXT
    for text in texts:
        if text.startswith("submit"):
            continue
        result = env.step(_code_ids(tasks, text))
        _check(result)
        assert not result.done
    nul = env.step(_code_ids(tasks, ADVERSARIAL_CALLS[4] if fmt == "tools" else ADVERSARIAL_TEXT[0]))
    assert nul.invalid_tool_calls == 1 and "NUL byte" in _shown(tasks, nul)


def _shown(tasks: LocalCodeTasks, result: StepResult) -> str:
    if tasks.renderer is not None:
        return tasks.renderer.tokenizer.decode(result.observation)
    return bytes(i for i in result.observation if i < 256).decode("utf-8", "replace")


@needs_bwrap
@FUZZ
@given(data=st.data())
def test_a_code_task_answers_random_actions_in_both_formats(code_envs, data):
    for fmt in ("text", "tools"):
        tasks, env = code_envs[fmt]
        if fmt == "tools":
            args = data.draw(
                st.recursive(
                    st.none() | st.booleans() | st.integers() | st.floats() | hostile_text,
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(hostile_text, c, max_size=3),
                    max_leaves=8,
                )
            )
            name = data.draw(st.sampled_from(["bash", "str_replace_editor", "nope"]))
            text = data.draw(
                st.sampled_from(
                    [_call(name, args), _call(name, {"command": args, "path": args}), data.draw(hostile_text)]
                )
            )
        else:  # any bytes after a verb: invalid UTF-8 and NUL included
            verb = data.draw(st.sampled_from([b"bash ", b"write ", b"replace ", b""]))
            raw = verb + data.draw(st.binary(max_size=300))
            if b"submit" not in raw:
                _check(env.step((*raw, tasks.stop_token)))
            continue
        if "submit" in text:
            continue
        _check(env.step(_code_ids(tasks, text)))


@needs_bwrap
@pytest.mark.parametrize("fmt", ["text", "tools"])
def test_a_mutation_task_answers_any_action(fmt):
    from thundersync_lightning.envs.mutations import MutationTasks

    extra = {"tokenizer_path": model_dir(), "action_format": "tools"} if fmt == "tools" else {}
    src = MutationTasks(
        uid_base=3_980_000, uid_count=16, sandbox_root="/tmp/thundersync-test-mutations", **extra
    )
    env = src.make_env(src.validation_tasks()[0], 0)
    try:
        env.reset()
        if fmt == "tools":
            actions = [
                _ids(src.renderer.tokenizer, t, src.stop_token)
                for t in ADVERSARIAL_CALLS
                if "submit" not in t
            ]
        else:
            actions = [(), (-1,), (10**30,), tuple(range(-3, 400))]
        for action in actions:
            _check(env.step(action))
    finally:
        env.close()
