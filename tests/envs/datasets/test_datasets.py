"""Bring your own prompts and rewards: DatasetTasks over datasets files, the reward registry, the
chat-template renderer, and every kind of bad input (a clear ConfigError, or a failed trajectory)."""

from __future__ import annotations

import json
import math

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.types import ContentReady, GroupRequest, RewardReady, RolloutRequest
from thundersync_lightning.envs.datasets import (
    DatasetTasks,
    RewardError,
    call_reward,
    register_reward,
    resolve_reward,
)
from thundersync_lightning.rollout.agent.env_pool import EnvPool
from thundersync_lightning.rollout.agent.loop import AgentLoop, Generation

from .._support import needs_bwrap

ROWS = [{"question": f"what is {i} + {i}?", "solution": str(2 * i), "re": f"^{2 * i}$"} for i in range(20)]


@pytest.fixture
def jsonl(tmp_path):  # noqa: ANN001, ANN201
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return str(path)


def reward_of(spec, completion, **row) -> float:  # noqa: ANN001, ANN003
    return call_reward(resolve_reward(spec), "p", completion, row)


def test_exact_match_compares_stripped_text_and_can_ignore_case() -> None:
    assert reward_of("exact_match", " 42\n", answer="42") == 1.0
    assert reward_of("exact_match", "41", answer="42") == 0.0
    assert reward_of({"name": "exact_match", "ignore_case": True}, "Paris", answer="paris") == 1.0


def test_regex_match_uses_the_configured_or_the_row_pattern() -> None:
    assert reward_of({"name": "regex_match", "pattern": r"\bdef \w+\("}, "def f(x): pass") == 1.0
    assert reward_of("regex_match", "abc", pattern="^b") == 0.0


def test_math_answer_reads_the_last_number_or_boxed_value() -> None:
    assert reward_of("math_answer", "so 3 + 4 = 7", answer="7") == 1.0
    assert reward_of("math_answer", r"the answer is \boxed{1/2}, not 3", answer="0.5") == 1.0
    assert reward_of("math_answer", "it is 1,000", answer="1000") == 1.0
    assert reward_of("math_answer", "8", answer="7") == 0.0
    assert reward_of("math_answer", "no number", answer="7") == 0.0


@needs_bwrap
def test_unit_tests_runs_the_completion_against_the_tests_in_the_sandbox() -> None:
    tests = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"
    good = "```python\ndef add(a, b):\n    return a + b\n```"
    bad = "def add(a, b):\n    return a - b\n"
    escape = (
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n"
        "def add(a, b):\n    return a + b\n"
    )
    assert reward_of("unit_tests", good, tests=tests) == 1.0
    assert reward_of("unit_tests", bad, tests=tests) == 0.0
    assert reward_of("unit_tests", escape, tests=tests) == 0.0  # no network in the sandbox


def test_a_reward_that_raises_or_returns_nan_is_a_reward_error_naming_it() -> None:
    @register_reward("test_nan_reward")
    def nan_reward(prompt, completion, **row):  # noqa: ANN001, ANN003, ANN202
        return math.nan

    with pytest.raises(RewardError, match="test_nan_reward.*nan"):
        reward_of("test_nan_reward", "x")
    with pytest.raises(RewardError, match="exact_match.*answer"):
        reward_of("exact_match", "x")  # no answer field: raises inside
    with pytest.raises(ConfigError, match="unknown reward 'nope'.*exact_match"):
        resolve_reward("nope")
    with pytest.raises(ConfigError, match="cannot be imported"):
        resolve_reward({"function": "no_such_module:fn"})


def test_missing_columns_are_one_config_error_listing_each(jsonl) -> None:  # noqa: ANN001
    with pytest.raises(ConfigError) as err:
        DatasetTasks(jsonl, fields={"answer": "sol"}, reward="nope")
    text = str(err.value)
    assert (
        "prompt -> column 'prompt'" in text and "answer -> column 'sol'" in text and "unknown reward" in text
    )


def run_episodes(tasks, actions, group=None):  # noqa: ANN001, ANN201
    """Run the real agent loop with scripted generations (texts encoded by the source's codec)."""
    it = iter(actions)

    def generate(requests):  # noqa: ANN001, ANN202
        out = []
        for _ in requests:
            ids = tuple(next(it))
            out.append(Generation(ids, (0.0,) * len(ids)))
        return out

    pool = EnvPool(2, name="test-datasets")
    try:
        task = group if group is not None else tasks.tasks(0, 1, 0)[0]
        events = []
        done = AgentLoop(tasks, generate, pool, coalesce_s=0).run(
            RolloutRequest(0, (GroupRequest("g", 0, task, 1),), 0), 0, events.append
        )
        done.wait(30)
    finally:
        pool.shutdown()
    content = next(e.trajectory for e in events if isinstance(e, ContentReady))
    reward = next(e for e in events if isinstance(e, RewardReady))
    return content, reward


def byte_action(tasks, text):  # noqa: ANN001, ANN201
    return (*tasks.codec.encode(text), tasks.stop_token)


def test_single_and_multi_turn_rows_are_graded_by_the_configured_reward(jsonl) -> None:  # noqa: ANN001
    one = DatasetTasks(jsonl, fields={"prompt": "question", "answer": "solution"}, reward="exact_match")
    task = one.tasks(0, 1, 0)[0]
    _, r = run_episodes(one, [byte_action(one, task.row["answer"])], task)
    assert (r.reward, r.failure) == (1.0, None)

    multi = DatasetTasks(
        jsonl, fields={"prompt": "question", "answer": "solution"}, reward="math_answer", max_turns=3
    )
    t, r = run_episodes(
        multi, [byte_action(multi, "1"), byte_action(multi, f"it is {task.row['answer']}")], task
    )
    assert r.reward == 1.0 and t.num_turns == 2
    assert b"Incorrect. Try again." in bytes(x for x in t.tokens if x < 256)
    assert {len(multi.validation_tasks()), len(multi.tasks(0, 5, 0))} and not set(
        x.index for x in multi.validation_tasks()
    ) & set(x.index for x in multi.tasks(0, 50, 0))


def test_a_null_field_or_a_failing_reward_fails_the_trajectory_with_its_reason(tmp_path) -> None:  # noqa: ANN001
    path = tmp_path / "rows.jsonl"
    path.write_text(
        json.dumps({"prompt": "q", "answer": None}) + "\n" + json.dumps({"prompt": "q", "answer": "a"}) + "\n"
    )
    tasks = DatasetTasks(str(path), fields={"answer": "answer"}, reward="exact_match", val_fraction=0.0)
    null_row = next(t for t in tasks.rows if t.row["answer"] is None)
    _, r = run_episodes(tasks, [], null_row)
    assert r.reward == 0.0 and "DatasetRowError: row 0 of" in r.failure  # a reward error: counted and warned
    assert "no value for mapped field(s) ['answer']" in r.failure

    @register_reward("test_raising_reward")
    def boom(prompt, completion, **row):  # noqa: ANN001, ANN003, ANN202
        raise RuntimeError("grader crashed")

    tasks = DatasetTasks(
        str(path), fields={"answer": "answer"}, reward="test_raising_reward", val_fraction=0.0
    )
    _, r = run_episodes(tasks, [byte_action(tasks, "a")], tasks.rows[1])
    assert r.reward == 0.0 and "test_raising_reward" in r.failure and "grader crashed" in r.failure
    assert "RewardError: " in r.failure  # what rollout/reward_error_fraction counts
    multi = DatasetTasks(
        str(path), fields={"answer": "answer"}, reward="test_raising_reward", val_fraction=0.0, max_turns=2
    )  # grading the first turn raises inside the environment's step
    t, r = run_episodes(multi, [byte_action(multi, "a")], multi.rows[1])
    assert t.finish_reason == "failure" and "RewardError: " in t.failure and r.reward == 0.0


def test_parquet_and_save_to_disk_directories_load_the_same_rows(tmp_path) -> None:  # noqa: ANN001
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    ds.to_parquet(str(tmp_path / "rows.parquet"))
    ds.save_to_disk(str(tmp_path / "rows_dir"))
    a = DatasetTasks(str(tmp_path / "rows.parquet"), fields={"prompt": "question", "answer": "solution"})
    b = DatasetTasks(str(tmp_path / "rows_dir"), fields={"prompt": "question", "answer": "solution"})
    assert (
        [t.row for t in a.rows]
        == [t.row for t in b.rows]
        == [{**r, "prompt": r["question"], "answer": r["solution"]} for r in ROWS]
    )  # every column, renames added


def test_a_reward_parameter_naming_no_column_is_refused_at_construction_naming_the_columns(jsonl) -> None:  # noqa: ANN001
    @register_reward("test_reads_reference")
    def reads_reference(prompt, completion, reference):  # noqa: ANN001, ANN202 - no such column
        return 1.0

    with pytest.raises(ConfigError) as err:
        DatasetTasks(
            jsonl, fields={"prompt": "question", "answer": "solution"}, reward="test_reads_reference"
        )
    text = str(err.value)
    assert "reads column 'reference'" in text
    assert (
        "columns: prompt, answer, question, solution, re" in text and "fields: {reference: <column>}" in text
    )
    # the same function runs once a column is mapped to the name; without **row it gets only what it names
    tasks = DatasetTasks(
        jsonl, fields={"prompt": "question", "reference": "solution"}, reward="test_reads_reference"
    )
    assert tasks.reward_sum("p", "c", tasks.rows[0].row) == 1.0


def test_a_function_taking_fewer_positional_arguments_than_its_convention_is_refused(jsonl) -> None:  # noqa: ANN001
    @register_reward("test_one_argument_reward")
    def one(completion):  # noqa: ANN001, ANN202 - neither TRL's (no `completions`) nor reward(prompt, completion)
        return 1.0

    with pytest.raises(
        ConfigError, match=r"takes fewer than the 2 positional arguments of the row convention"
    ):
        DatasetTasks(jsonl, fields={"prompt": "question"}, reward="test_one_argument_reward")


def test_an_unimportable_reward_says_which_part_failed_and_how_to_make_it_importable(
    tmp_path, monkeypatch
) -> None:  # noqa: ANN001
    (tmp_path / "my_rewards.py").write_text("def score(prompt, completion, **row):\n    return 1.0\n")
    tmp_path.chmod(0o755)  # the reward's worker runs as a uid of its own: it reads the module as others do
    with pytest.raises(ConfigError, match=r"(?s)module 'no_such_rewards' cannot be imported .*PYTHONPATH=\."):
        resolve_reward({"function": "no_such_rewards:score"})
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match=r"has no 'scor'; its callables: score"):
        resolve_reward({"function": "my_rewards:scor"})
    with pytest.raises(ConfigError, match=r"write it as 'module:callable'"):
        resolve_reward({"function": "my_rewards.score"})
    with pytest.raises(ConfigError, match=r"did you mean 'exact_match'"):
        resolve_reward("exact_mach")
    assert reward_of({"function": "my_rewards:score"}, "x") == 1.0


def test_byte_level_text_needs_259_token_ids_and_a_smaller_policy_is_refused_naming_both(jsonl) -> None:  # noqa: ANN001
    from thundersync_lightning.core.contract import check_vocabulary
    from thundersync_lightning.envs.toy import toy_model_spec
    from thundersync_lightning.modules import GRPOPolicy

    tasks = DatasetTasks(jsonl, fields={"prompt": "question", "answer": "solution"})
    assert tasks.vocab_size == 259
    small = GRPOPolicy(config=dict(toy_model_spec().config))  # the toy's 16 ids
    (problem,) = check_vocabulary(small, tasks)
    assert "embeds 16 token ids" in problem and "vocab_size 259" in problem and "tokenizer_path" in problem
    assert check_vocabulary(GRPOPolicy(config={**toy_model_spec().config, "vocab_size": 259}), tasks) == []


def test_the_datasets_recipe_needs_no_extra_beyond_the_package() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).parents[3] / "pyproject.toml").read_text()
    dependencies = text.split("dependencies = [", 1)[1].split("\n]", 1)[
        0
    ]  # [project] dependencies, not extras
    assert re.search(r'^\s*"datasets>=', dependencies, re.M)


def test_a_user_reward_runs_in_a_worker_process_stopped_at_its_deadline() -> None:
    """A thread cannot be stopped: a user's reward that never returns holds no engine thread; it is
    stopped at the deadline and fails its trajectory, and the same worker pool scores the next."""
    from thundersync_lightning.envs.datasets.rewards import call_reward

    endless = resolve_reward("tests.envs.user_rewards:endless")
    assert endless.path == "tests.envs.user_rewards:endless"
    with pytest.raises(
        RewardError,
        match=r"reward 'tests.envs.user_rewards:endless': endless did not return "
        r"within 1 s and was stopped",
    ):
        call_reward(endless, "p", "c", {}, timeout_s=1.0)
    length = resolve_reward({"function": "tests.envs.user_rewards:length", "scale": 2.0})
    assert call_reward(length, [{"role": "user", "content": "p"}], "abc", {"answer": 1}) == 6.0
    with pytest.raises(
        RewardError, match=r"'tests.envs.user_rewards:yes' returned True: expected a finite number"
    ):
        call_reward(resolve_reward("tests.envs.user_rewards:yes"), "p", "c", {})
    with pytest.raises(
        RewardError, match=r"'tests.envs.user_rewards:explode' raised ValueError: cannot score 'c'"
    ):
        call_reward(resolve_reward("tests.envs.user_rewards:explode"), "p", "c", {})
    assert resolve_reward("exact_match").path is None and resolve_reward(lambda p, c, **r: 1.0).path is None
