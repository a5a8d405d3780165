"""DatasetTasks with the user's own tools, data and rewards by name: schemas, worker processes
with deadlines, conversational prompts, weighted rewards, bad data named where it is, and an
episode through the agent loop that counts each tool fault in its trajectory."""

from __future__ import annotations

import functools
import json
import tempfile

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.types import ContentReady, GroupRequest, RewardReady, RolloutRequest
from thundersync_lightning.envs.datasets import DatasetTasks, RewardSum, read_rows
from thundersync_lightning.envs.tools import ToolWorkers, python_tool
from thundersync_lightning.rollout.agent.env_pool import EnvPool
from thundersync_lightning.rollout.agent.loop import AgentLoop, Generation

from ..qwen_style import save_tokenizer
from ..user_tools import TOOLS


@pytest.fixture
def user_tools(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    (tmp_path / "user_tools.py").write_text(TOOLS)
    (tmp_path / "needs_pkg.py").write_text("import not_installed_pkg\n")
    tmp_path.chmod(0o755)  # confined workers run as a uid of their own: a user's module directory is o+rx
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path


@functools.cache
def tokenizer_dir() -> str:
    directory = tempfile.mkdtemp(prefix="qwen-style-")
    save_tokenizer(directory)
    return directory


def call(name: str, **arguments) -> str:  # noqa: ANN003
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def tool_tasks(rows, **kwargs) -> DatasetTasks:  # noqa: ANN001, ANN003
    options = {
        "fields": {"answer": "answer"},
        "reward": "user_tools:correct",
        "tokenizer_path": tokenizer_dir(),
        "tools": ["user_tools:add", "user_tools:wait", "user_tools:explode"],
        "tool_timeout_s": 1.0,
        "max_turns": 3,
        **kwargs,
    }
    return DatasetTasks(rows, **options)


# ------------------------------------------------------------------ tools by name


def test_a_tool_by_name_takes_its_schema_from_type_hints_and_docstring(user_tools) -> None:
    tool = python_tool("user_tools:add", timeout_s=5.0)
    assert tool.name == "add" and tool.description == "Add two integers."
    assert tool.parameters == {
        "type": "object",
        "required": ["a", "b"],
        "properties": {
            "a": {"type": "integer", "description": "the first integer"},
            "b": {"type": "integer", "description": "the second integer"},
        },
    }


def test_an_explicit_schema_that_is_not_json_schema_is_refused_at_set_up_with_each_problem(
    user_tools,
) -> None:
    bad = {"function": "user_tools:add", "parameters": {"type": "objekt", "required": "expression"}}
    with pytest.raises(ConfigError) as err:
        tool_tasks([{"prompt": "p", "answer": "1"}], tools=[bad])
    text = str(err.value)
    assert "parameters/required: 'expression' is not of type 'array'" in text
    assert "parameters/type: 'objekt' is not valid" in text


def test_a_function_without_type_hints_is_refused_with_the_fix(user_tools) -> None:
    with pytest.raises(ConfigError, match=r"(?s)user_tools:untyped.*type hint.*parameters"):
        python_tool("user_tools:untyped", timeout_s=5.0)


def test_an_unimportable_tool_module_names_the_fix_in_a_few_lines(user_tools) -> None:
    with pytest.raises(ConfigError) as missing:
        python_tool("no_such_tools:add", timeout_s=5.0)
    assert "No module named 'no_such_tools'" in str(missing.value) and "PYTHONPATH=." in str(missing.value)
    with pytest.raises(ConfigError) as needs:
        python_tool("needs_pkg:f", timeout_s=5.0)
    assert "pip install not_installed_pkg" in str(needs.value)
    assert len(str(needs.value).splitlines()) <= 3 and len(str(missing.value).splitlines()) <= 3


# ------------------------------------------------------------------ worker processes


def test_a_tool_that_hangs_is_killed_at_its_deadline_and_one_that_raises_or_dies_is_an_error(
    user_tools,
) -> None:
    workers = ToolWorkers()
    try:
        assert workers.call("user_tools:add", {"a": 2, "b": 3}, timeout_s=30.0).text == "5"
        hung = workers.call("user_tools:wait", {"seconds": 9}, timeout_s=0.5)
        assert hung.timed_out and hung.error == "wait did not return within 0.5 s and was stopped"
        raised = workers.call("user_tools:explode", {"reason": "x"}, timeout_s=30.0)
        assert raised.error == "explode raised RuntimeError: exploded: x" and not raised.timed_out
        died = workers.call("user_tools:vanish", {}, timeout_s=30.0)
        assert died.error == "vanish: its worker process exited (code 3) before answering"
        assert (
            workers.call("user_tools:add", {"a": 1, "b": 1}, timeout_s=30.0).text == "2"
        )  # the pool lives on
    finally:
        workers.close()


# ------------------------------------------------------------------ episodes


def test_a_tool_turn_answers_each_fault_with_an_error_and_counts_it(user_tools) -> None:
    tasks = tool_tasks([{"prompt": "What is 2 + 3?", "answer": "5"}])
    env = tasks.make_env(tasks.rows[0], 0)
    env.reset()
    r = tasks.renderer
    action = (
        *r.tokenizer.encode(
            call("add", a=2, b=3) + call("wait", seconds=9) + call("explode", reason="y"),
            add_special_tokens=False,
        ),
        r.end_of_turn,
    )
    result = env.step(action)
    assert (result.tool_calls, result.invalid_tool_calls, result.tool_errors, result.tool_timeouts) == (
        3,
        0,
        2,
        1,
    )
    assert result.tool_error == "wait did not return within 1 s and was stopped"
    text = r.tokenizer.decode(result.observation)
    assert "<tool_response>\n5\n</tool_response>" in text
    assert "[tool error] explode raised RuntimeError: exploded: y" in text
    answer = env.step(
        (*r.tokenizer.encode("<think>\nsum\n</think>\n\nIt is 5.", add_special_tokens=False), r.end_of_turn)
    )
    assert answer.done and env.verdict() == 1.0


@pytest.mark.parametrize("end_on_answer", [True, False])
def test_a_turn_the_renderer_cannot_decode_is_an_invalid_call_not_a_failed_episode(
    user_tools, monkeypatch, end_on_answer
) -> None:
    tasks = tool_tasks([{"prompt": "What is 2 + 3?", "answer": "5"}], end_on_answer=end_on_answer)
    env = tasks.make_env(tasks.rows[0], 0)
    env.reset()
    r = tasks.renderer

    def broken(ids):  # noqa: ANN001, ANN202 - e.g. ids past the vocabulary from a misconfigured engine
        raise ValueError("id out of range")

    monkeypatch.setattr(r, "decode", broken)
    result = env.step((*r.tokenizer.encode("anything", add_special_tokens=False), r.end_of_turn))
    assert not result.done and (result.tool_calls, result.invalid_tool_calls) == (1, 1)
    assert "could not be decoded" in r.tokenizer.decode(result.observation)


def test_the_reminder_after_a_turn_without_a_call_names_the_users_tools_and_no_submit(user_tools) -> None:
    tasks = tool_tasks([{"prompt": "hi", "answer": "5"}], end_on_answer=False)
    env = tasks.make_env(tasks.rows[0], 0)
    env.reset()
    r = tasks.renderer
    result = env.step((*r.tokenizer.encode("no call", add_special_tokens=False), r.end_of_turn))
    text = r.tokenizer.decode(result.observation)
    assert "Call one of the tools (add, wait, explode)." in text and "submit" not in text


def test_a_conversational_prompt_is_kept_with_its_system_message(user_tools) -> None:
    prompt = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "2+3?"}]
    tasks = tool_tasks([{"prompt": prompt, "answer": "5"}], system_prompt="ignored when the row has one")
    assert tasks.messages_of(tasks.rows[0]) == prompt
    text = tasks.renderer.tokenizer.decode(tasks.make_env(tasks.rows[0], 0).reset())
    assert "<|im_start|>system\nYou are terse." in text and "<|im_start|>user\n2+3?<|im_end|>" in text
    assert "ignored" not in text


def test_an_in_memory_dataset_and_a_list_of_rows_are_data(user_tools) -> None:
    import datasets

    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": "2"}]
    for data in (rows, datasets.Dataset.from_list(rows)):
        tasks = DatasetTasks(data, fields={"answer": "answer"})
        assert [t.row for t in tasks.rows] == rows


def test_a_line_that_is_not_json_is_named_by_file_and_line_and_an_empty_file_says_so(tmp_path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b",\n')
    with pytest.raises(ConfigError) as err:
        read_rows(str(path))
    assert str(err.value).startswith(f"{path}:2: not valid JSON") and len(str(err.value).splitlines()) == 1
    path.write_text("")
    with pytest.raises(ConfigError, match="has no rows"):
        DatasetTasks(str(path))


def test_weighted_rewards_sum_their_values_and_keep_each_one_by_name(user_tools) -> None:
    rewards = RewardSum(
        ["user_tools:correct", "user_tools:brief", {"name": "regex_match", "pattern": "5"}], [1.0, 0.5, 2.0]
    )
    value = rewards("p", "it is 5", {"answer": "5"})
    assert value == 1.0 * 1.0 + 0.5 * 1.0 + 2.0 * 1.0  # every reward passes
    assert value.parts == (("correct", 1.0), ("brief", 1.0), ("regex_match", 1.0))
    with pytest.raises(ConfigError, match="reward_weights has 1 values for 2 rewards"):
        RewardSum(["user_tools:correct", "user_tools:brief"], [1.0])


def test_an_episode_counts_tool_faults_and_a_row_with_a_null_field_fails_alone(user_tools) -> None:
    tasks = tool_tasks(
        [{"prompt": "2+3?", "answer": "5"}, {"prompt": "1+1?", "answer": None}],
        reward=["user_tools:correct", "user_tools:brief"],
        reward_weights=[1.0, 0.5],
    )
    r = tasks.renderer
    turns = iter([call("explode", reason="z") + call("wait", seconds=1), "It is 5."])

    def generate(requests):  # noqa: ANN001, ANN202
        out = []
        for _ in requests:
            ids = (*r.tokenizer.encode(next(turns), add_special_tokens=False), r.end_of_turn)
            out.append(Generation(ids, (0.0,) * len(ids)))
        return out

    events: list = []
    pool = EnvPool(2, name="test-dataset-tools")
    try:
        request = RolloutRequest(
            0, (GroupRequest("g0", 0, tasks.rows[0], 1), GroupRequest("g1", 1, tasks.rows[1], 1)), 0
        )
        assert AgentLoop(tasks, generate, pool, coalesce_s=0).run(request, 0, events.append).wait(60)
    finally:
        pool.shutdown()
    content = {e.trajectory.group_id: e.trajectory for e in events if isinstance(e, ContentReady)}
    rewards = {e.group_id: e for e in events if isinstance(e, RewardReady)}
    good = content["g0"]
    assert (good.tool_calls, good.tool_errors, good.tool_timeouts) == (2, 2, 1)
    assert good.tool_error == "explode raised RuntimeError: exploded: z"
    assert rewards["g0"].reward == 1.5 and rewards["g0"].parts == (("correct", 1.0), ("brief", 1.0))
    assert content["g1"].finish_reason == "failure" and content["g1"].tokens == ()
    assert rewards["g1"].reward == 0.0 and "no value for mapped field(s) ['answer']" in rewards["g1"].failure
    assert tasks.reward_names == ("correct", "brief")


@pytest.mark.parametrize(("tool_timeout_s", "warned"), [(10.0, False), (45.0, True)])
def test_a_tool_deadline_that_outlasts_the_engines_step_timeout_is_warned_about(
    user_tools, caplog, tool_timeout_s, warned
) -> None:
    with caplog.at_level("WARNING"):
        tool_tasks([{"prompt": "hi", "answer": "5"}], tool_timeout_s=tool_timeout_s)
    assert ("a tool turn may take 75 s" in caplog.text) is warned
