"""A TRL or verl user's reward functions run unchanged: recognised by their parameters, called as
their library calls them (through the real reward worker), with every column, None as "not
applicable", unscorable completions flagged, and a parameter naming no column refused at set-up."""

from __future__ import annotations

import json
import logging

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.types import ContentReady, GroupRequest, RewardReady, RolloutRequest
from thundersync_lightning.envs.datasets import DatasetTasks, RewardError, RewardInput, RewardSum
from thundersync_lightning.envs.datasets.conventions import ROW, TRL, VERL
from thundersync_lightning.envs.datasets.rewards import call_reward, resolve_reward
from thundersync_lightning.rollout.agent.env_pool import EnvPool
from thundersync_lightning.rollout.agent.loop import AgentLoop, Generation

from .test_tool_env import call, tool_tasks, user_tools  # noqa: F401 - user_tools is a fixture

PEER = "tests.envs.peer_rewards"
CHAT = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": "What is 2 + 3?"}]


def test_each_convention_is_recognised_by_the_parameters_the_function_names() -> None:
    assert resolve_reward(f"{PEER}:format_reward").convention is TRL  # completions
    assert resolve_reward(f"{PEER}:async_length").convention is TRL  # prompts
    assert resolve_reward(f"{PEER}:compute_score").convention is VERL  # solution_str
    assert resolve_reward("exact_match").convention is ROW
    assert (
        resolve_reward(f"{PEER}:correctness").convention is TRL
    )  # (completions, answer): never (prompt, completion)


def test_a_trl_reward_gets_trls_keyword_lists_and_the_conversational_completion_as_messages() -> None:
    row = {"prompt": CHAT, "answer": "5", "task": "math", "completion_ids": [9]}
    inp = RewardInput(CHAT, "It is 5", row, completion_ids=(7, 8, 2))
    params = dict(resolve_reward(f"{PEER}:format_reward").params or {})
    positional, keywords = TRL.call(inp, params, {"scale": 2})
    assert positional == ()
    assert (
        keywords
        == {  # as GRPOTrainer._calculate_rewards: every column but prompt/completion(_ids) as a list
            "prompts": [CHAT],
            "completions": [[{"role": "assistant", "content": "It is 5"}]],
            "completion_ids": [[7, 8, 2]],
            "answer": ["5"],
            "task": ["math"],
            "scale": 2,
        }
    )
    plain = RewardInput("What is 2 + 3?", "It is 5", {"prompt": "What is 2 + 3?"})
    assert TRL.call(plain, params, {})[1]["completions"] == ["It is 5"]  # a string prompt: strings, as TRL


def test_trl_rewards_run_in_workers_with_none_left_out_of_the_weighted_sum() -> None:
    rewards = RewardSum([f"{PEER}:format_reward", f"{PEER}:correctness"], [0.5, 2.0])
    assert all(fn.path for fn in rewards.rewards)  # both in worker processes
    scored = rewards.score(RewardInput(CHAT, "It is 5", {"prompt": CHAT, "answer": 5}))
    assert scored == 0.5 * 1.0 + 2.0 * 1.0 and scored.parts == (("format_reward", 1.0), ("correctness", 1.0))
    declined = rewards.score(
        RewardInput(CHAT, "It is 4", {"prompt": CHAT, "answer": None})
    )  # correctness: None
    assert declined == 0.5 and declined.parts == (("format_reward", 1.0),) and not declined.unscorable
    assert declined.failure is None


def test_a_completion_every_reward_declines_is_unscorable_not_failed() -> None:
    rewards = RewardSum([f"{PEER}:declines", f"{PEER}:correctness"])
    value = rewards.score(RewardInput("q", "7", {"prompt": "q", "answer": None}))
    assert (float(value), value.unscorable, value.failure, value.parts) == (0.0, True, None, ())


def test_an_async_trl_reward_is_awaited_in_its_worker() -> None:
    reward = resolve_reward(f"{PEER}:async_length")
    assert reward.path is not None
    assert call_reward(reward, RewardInput("q", "abc", {"prompt": "q"}, completion_ids=(1, 2, 3, 4))) == 0.04


def test_a_trl_reward_returning_the_wrong_number_of_values_or_no_list_is_a_reward_error() -> None:
    with pytest.raises(RewardError, match=r"two_values' returned 2 values for 1 completion"):
        call_reward(resolve_reward(f"{PEER}:two_values"), RewardInput("q", "c", {"prompt": "q"}))

    def scalar(completions, **kwargs):  # noqa: ANN001, ANN003, ANN202 - in the caller's thread
        return 1.0

    with pytest.raises(RewardError, match=r"returned 1.0: a TRL reward returns a list"):
        call_reward(resolve_reward(scalar), RewardInput("q", "c", {"prompt": "q"}))


def test_one_failing_reward_fails_the_trajectory_but_keeps_the_others_values() -> None:
    rewards = RewardSum([f"{PEER}:format_reward", f"{PEER}:two_values"])
    value = rewards.score(RewardInput("q", "it is 5", {"prompt": "q"}))
    assert float(value) == 0.0 and value.failure.startswith(
        "RewardError: reward 'tests.envs.peer_rewards:two_values'"
    )
    assert value.parts == (("format_reward", 1.0),)  # still counted in format_reward's mean


@pytest.mark.parametrize(
    ("row", "score"),
    [
        (
            {"data_source": "gsm8k", "reward_model": {"ground_truth": "5", "style": "rule"}},
            1.0,
        ),  # verl's data prep
        ({"data_source": "gsm8k", "ground_truth": "5"}, 1.0),
        ({"data_source": "gsm8k", "answer": "6"}, 0.0),
        (
            {"data_source": "dict_source", "answer": "5", "extra_info": {"split": "train"}},
            0.5,
        ),  # {"score": 0.5, ...}
    ],
)
def test_a_verl_compute_score_runs_unchanged_with_the_rows_fields_mapped_as_verl_does(row, score) -> None:
    reward = resolve_reward(f"{PEER}:compute_score")
    assert reward.path is not None
    assert call_reward(reward, RewardInput("q", "so it is 5", {"prompt": "q", **row})) == score


def test_verl_gets_its_four_arguments_with_num_turns_in_extra_info() -> None:
    row = {
        "prompt": "q",
        "data_source": "s",
        "reward_model": {"ground_truth": "5"},
        "extra_info": {"index": 3},
        "other": 1,
    }
    params = dict(resolve_reward(f"{PEER}:compute_score").params or {})
    assert VERL.call(RewardInput("q", "a", row, num_turns=2), params, {})[1] == {
        "data_source": "s",
        "solution_str": "a",
        "ground_truth": "5",
        "extra_info": {"index": 3, "num_turns": 2},
    }


def test_a_reward_parameter_naming_a_missing_column_is_a_set_up_error_naming_the_columns(tmp_path) -> None:
    """The old false positive: correctness(completions, answer, **kwargs) was called with the prompt
    as `completions`; now it is TRL-shaped, and without an `answer` column it is refused."""
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "q", "solution": "5"}) + "\n")
    with pytest.raises(ConfigError) as err:
        DatasetTasks(str(path), reward=[f"{PEER}:format_reward", f"{PEER}:correctness"])
    text = str(err.value)
    assert "reward 'tests.envs.peer_rewards:correctness' (trl convention) reads column 'answer'" in text
    assert "(columns: prompt, solution)" in text and "fields: {answer: <column>}" in text
    assert "format_reward" not in text  # only the reward that cannot be called is named
    tasks = DatasetTasks(str(path), fields={"answer": "solution"}, reward=f"{PEER}:correctness")
    assert tasks.reward_sum.score(RewardInput("q", "it is 5", tasks.rows[0].row)) == 1.0  # `fields` renames

    def uses_state(completions, trainer_state, **kwargs):  # noqa: ANN001, ANN003, ANN202
        return [1.0]

    with pytest.raises(ConfigError, match=r"names 'trainer_state': is TRL's and is not passed here"):
        DatasetTasks(str(path), reward=uses_state)


def run_group(tasks, texts, task):  # noqa: ANN001, ANN201
    """One group of ``len(texts)`` byte-level single-turn episodes through the real agent loop."""
    it = iter(texts)

    def generate(requests):  # noqa: ANN001, ANN202
        return [
            Generation(ids, (0.0,) * len(ids))
            for ids in ((*tasks.codec.encode(next(it)), tasks.stop_token) for _ in requests)
        ]

    pool = EnvPool(2, name="test-conventions")
    events: list = []
    try:
        done = AgentLoop(tasks, generate, pool, coalesce_s=0).run(
            RolloutRequest(0, (GroupRequest("g", 0, task, len(texts)),), 0), 0, events.append
        )
        assert done.wait(60)
    finally:
        pool.shutdown()
    return (
        [e.trajectory for e in events if isinstance(e, ContentReady)],
        sorted((e for e in events if isinstance(e, RewardReady)), key=lambda e: e.trajectory_id),
    )


def test_an_unscorable_completion_reaches_the_learner_flagged_and_is_warned_once_with_its_row(
    tmp_path, caplog
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "2+3?", "answer": None, "topic": "sums"}) + "\n")
    tasks = DatasetTasks(str(path), reward=[f"{PEER}:correctness", f"{PEER}:declines"], val_fraction=0.0)
    with caplog.at_level(logging.WARNING, logger="thundersync_lightning.envs.datasets.source"):
        _, rewards = run_group(tasks, ["5", "6"], tasks.rows[0])
    assert [(r.reward, r.failure, r.unscorable, r.parts) for r in rewards] == [(0.0, None, True, ())] * 2
    warned = [r.message for r in caplog.records if "Every reward returned None" in r.message]
    assert len(warned) == 1 and "row 0 of" in warned[0] and "'topic': 'sums'" in warned[0]


def test_a_row_that_fails_at_reset_is_a_dataset_row_error_counted_as_a_reward_error(tmp_path) -> None:
    from thundersync_lightning.strategy.stats import TrajectoryRecord

    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": None, "answer": "5"}) + "\n")
    tasks = DatasetTasks(str(path), reward=f"{PEER}:correctness", val_fraction=0.0)
    content, rewards = run_group(tasks, ["never generated"], tasks.rows[0])
    assert "DatasetRowError: row 0 of" in rewards[0].failure and "['prompt']" in rewards[0].failure
    record = TrajectoryRecord(
        content[0].trajectory_id,
        "g",
        0,
        0,
        0.0,
        0,
        0,
        0,
        content[0].finish_reason,
        rewards[0].failure,
        0.0,
        0.0,
    )
    assert (
        record.reward_error and record.row_error
    )  # what rollout/reward_error_fraction and summary.json count


def test_an_async_reward_no_worker_can_import_is_awaited_in_the_callers_thread() -> None:
    async def judge(prompts, completions, **kwargs):  # noqa: ANN001, ANN003, ANN202 - a local function: no worker
        return [0.5 if "5" in c else None for c in completions]

    reward = resolve_reward(judge)
    assert reward.path is None
    assert call_reward(reward, RewardInput("q", "it is 5", {"prompt": "q"})) == 0.5
    assert call_reward(reward, RewardInput("q", "no", {"prompt": "q"})) is None


def test_a_null_in_a_column_no_field_maps_reaches_the_reward_and_fails_nothing(tmp_path) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({"prompt": "2+3?", "answer": 5, "hint": None}) + "\n")
    tasks = DatasetTasks(str(path), reward=f"{PEER}:correctness", val_fraction=0.0)
    assert tasks.rows[0].row == {"prompt": "2+3?", "answer": 5, "hint": None}
    _, rewards = run_group(tasks, ["5"], tasks.rows[0])
    assert (rewards[0].reward, rewards[0].failure) == (1.0, None)


def test_a_column_named_like_a_positionally_filled_parameter_does_not_clash() -> None:
    def score(question, answer, **row):  # noqa: ANN001, ANN003, ANN202 - (prompt, completion) under other names
        return float(answer == "5")

    reward = resolve_reward(score)
    assert call_reward(reward, RewardInput("q", "5", {"prompt": "q", "answer": "4", "question": "q"})) == 1.0


def test_a_trl_reward_sees_a_tool_episode_as_trls_tool_loop_gives_it(user_tools) -> None:  # noqa: F811
    """The assistant turn with its call, the tool's message, the answer last; every token after the
    prompt as completion_ids (a local function: it runs in this thread and keeps what it got)."""
    seen: list[dict] = []

    def record(prompts, completions, completion_ids, **kwargs):  # noqa: ANN001, ANN003, ANN202
        seen.append(
            {"prompts": prompts, "completions": completions, "completion_ids": completion_ids, **kwargs}
        )
        return [1.0]

    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    tasks = tool_tasks([{"prompt": chat, "answer": "5", "level": 1}], reward=record, fields=None)
    env = tasks.make_env(tasks.rows[0], 0)
    env.reset()
    r = tasks.renderer
    first = (*r.tokenizer.encode(call("add", a=2, b=3), add_special_tokens=False), r.end_of_turn)
    observation = env.step(first).observation
    last = (*r.tokenizer.encode("It is 5.", add_special_tokens=False), r.end_of_turn)
    assert env.step(last).done and env.verdict() == 1.0
    (got,) = seen
    assert got["prompts"] == [chat] and got["answer"] == ["5"] and got["level"] == [1]
    (messages,) = got["completions"]
    assert [m["role"] for m in messages] == ["assistant", "tool", "assistant"]
    assert messages[0]["tool_calls"][0]["function"]["name"] == "add" and messages[1]["content"] == "5"
    assert messages[-1] == {"role": "assistant", "content": "It is 5."}
    assert got["completion_ids"] == [[*first, *observation, *last]]
