"""TRL's tools, environment classes and eval split in ``DatasetTasks``: function objects as tools,
``environment_factory`` (one instance per trajectory in a worker of its own, ``reset(**row)``,
methods as tools, ``get_reward`` as one more reward), ``eval_dataset`` / ``val_path``."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.types import ContentReady, GroupRequest, RewardReady, RolloutRequest
from thundersync_lightning.envs.datasets import DatasetTasks
from thundersync_lightning.envs.datasets.rewards import REWARD_TIMEOUT_S
from thundersync_lightning.envs.tools import InThreadToolHandler, PythonToolHandler, ToolWorkers
from thundersync_lightning.rollout.agent.env_pool import EnvPool
from thundersync_lightning.rollout.agent.loop import AgentLoop, Generation

from .test_tool_env import call, tokenizer_dir

ENVS = textwrap.dedent('''
    import asyncio, time


    def add(a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: the first integer
            b: the second integer
        """
        return a + b


    class Counter:
        def reset(self, **row) -> str | None:
            self.row, self.total = row, 0
            return f" Reach {row['answer']}."

        def bump(self, by: int) -> int:
            """Add to the running total.

            Args:
                by: how much
            """
            self.total += by
            return self.total

        def stall(self, seconds: int) -> str:
            """Never comes back.

            Args:
                seconds: how long
            """
            time.sleep(3600)
            return "done"

        def _private(self) -> None:
            pass

        async def get_reward(self) -> float:
            await asyncio.sleep(0)
            return float(self.total == int(self.row["answer"]))


    class Quiet:
        def reset(self, **row) -> None:
            self.seen = sorted(row)

        def columns(self) -> str:
            """The columns reset was given."""
            return ",".join(self.seen)


    class Broken:
        def reset(self, **row) -> str:
            raise RuntimeError("no board for " + row["prompt"])

        def move(self) -> str:
            """Move."""
            return "moved"


    class NoReset:
        def move(self) -> str:
            """Move."""
            return "moved"


    class Untyped:
        def reset(self, **row) -> None:
            pass

        def move(self, x):
            return x


    class Judge:
        def reset(self, **row) -> None:
            self.answer = row["answer"]

        def look(self) -> str:
            """Look."""
            return "nothing"

        def get_reward(self):
            return None if self.answer is None else 1.0


    def make_counter():
        return Counter()


    def correct(prompt, completion, answer, **row):
        return float(str(answer) in completion)
''')


@pytest.fixture
def envs(tmp_path, monkeypatch):  # noqa: ANN001, ANN201
    (tmp_path / "trl_envs.py").write_text(ENVS)
    tmp_path.chmod(0o755)  # confined workers run as a uid of their own: a user's module directory is o+rx
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "trl_envs", raising=False)
    import trl_envs

    yield trl_envs


def tasks_with(rows, **kwargs) -> DatasetTasks:  # noqa: ANN001, ANN003
    options = {
        "fields": {"answer": "answer"},
        "tokenizer_path": tokenizer_dir(),
        "tool_timeout_s": 1.0,
        "max_turns": 3,
        **kwargs,
    }
    return DatasetTasks(rows, **options)


def run_episodes(tasks: DatasetTasks, turns: list[list[str]]) -> tuple[dict, dict]:
    """One single-member group per row of ``tasks.rows`` (each row's prompt holds ``[gI]``), each
    answered by its own scripted turns; the content and reward events by group id."""
    r = tasks.renderer
    scripts = {f"g{i}": iter(t) for i, t in enumerate(turns)}

    def generate(requests):  # noqa: ANN001, ANN202
        out = []
        for req in requests:
            group = next(g for g in scripts if f"[{g}]" in r.tokenizer.decode(list(req.prefix)))
            ids = (*r.tokenizer.encode(next(scripts[group]), add_special_tokens=False), r.end_of_turn)
            out.append(Generation(ids, (0.0,) * len(ids)))
        return out

    events: list = []
    pool = EnvPool(2, name="test-dataset-environments")
    try:
        groups = tuple(GroupRequest(f"g{i}", i, task, 1) for i, task in enumerate(tasks.rows[: len(turns)]))
        assert (
            AgentLoop(tasks, generate, pool, coalesce_s=0)
            .run(RolloutRequest(0, groups, 0), 0, events.append)
            .wait(60)
        )
    finally:
        pool.shutdown()
    content = {e.trajectory.group_id: e.trajectory for e in events if isinstance(e, ContentReady)}
    rewards = {e.group_id: e for e in events if isinstance(e, RewardReady)}
    return content, rewards


# ------------------------------------------------------------------ tools as function objects


def test_a_function_object_is_a_tool_run_in_a_worker_with_its_schema_from_hints_and_docstring(envs) -> None:
    tasks = tasks_with([{"prompt": "2+3?", "answer": "5"}], tools=[envs.add], reward="trl_envs:correct")
    (tool,) = tasks.tools
    assert tool.name == "add" and tool.description == "Add two integers."
    assert tool.parameters["required"] == ["a", "b"]
    assert tool.handler == PythonToolHandler("trl_envs:add", 1.0, 65536)
    workers = ToolWorkers(max_idle=1, limits=tasks.worker_limits)  # the episode's pool, the handler's context
    try:
        assert tool.handler(workers, {"a": 2, "b": 3}).text == "5"
    finally:
        workers.close()


def test_a_function_no_worker_can_import_runs_in_a_thread_with_the_deadline(envs) -> None:
    import threading

    release = threading.Event()

    def hold(seconds: int) -> str:
        """Wait.

        Args:
            seconds: how long
        """
        release.wait(3600)
        return "done"

    tasks = tasks_with(
        [{"prompt": "p", "answer": "1"}], tools=[hold], reward="trl_envs:correct", tool_timeout_s=0.2
    )
    (tool,) = tasks.tools
    assert isinstance(tool.handler, InThreadToolHandler)
    result = tool.handler(None, {"seconds": 1})
    release.set()
    assert result.timed_out and result.error == "hold did not return within 0.2 s and was abandoned"


@pytest.mark.parametrize(
    ("tools", "message"),
    [
        ("trl_envs:add", "tools must be a list"),
        ([3], "tool 3: give a function, 'module:function' or a mapping"),
        ([lambda a: a], "a function tool needs a name"),
    ],
)
def test_what_is_not_a_tool_is_a_config_error_saying_what_a_tool_is(envs, tools, message) -> None:
    with pytest.raises(ConfigError, match=message):
        tasks_with([{"prompt": "p", "answer": "1"}], tools=tools, reward="trl_envs:correct")


# ------------------------------------------------------------------ environment classes


def test_each_trajectory_gets_its_own_instance_reset_with_the_row_and_rewarded_by_get_reward(envs) -> None:
    rows = [{"prompt": "Count [g0].", "answer": "5"}, {"prompt": "Count [g1].", "answer": "3"}]
    tasks = tasks_with(
        rows, environment_factory=envs.Counter, reward="trl_envs:correct", reward_weights=[0.5]
    )
    assert tasks.reward_names == ("correct", "Counter")
    first = tasks.make_env(tasks.rows[0], 0)
    prompt = tasks.renderer.tokenizer.decode(first.reset())
    first.close()
    assert "<|im_start|>user\nCount [g0]. Reach 5.<|im_end|>" in prompt and '"name": "bump"' in prompt
    assert '"name": "stall"' in prompt and "_private" not in prompt and "get_reward" not in prompt
    content, rewards = run_episodes(
        tasks, [[call("bump", by=2) + call("bump", by=3), "Done: 5"], [call("bump", by=2), "Done: 5"]]
    )
    assert rewards["g0"].parts == (("correct", 1.0), ("Counter", 1.0)) and rewards["g0"].reward == 1.5
    assert rewards["g1"].parts == (("correct", 0.0), ("Counter", 0.0)) and rewards["g1"].reward == 0.0
    assert content["g0"].tool_calls == 2 and content["g0"].tool_errors == 0


def test_a_method_past_its_deadline_is_stopped_and_the_instance_is_gone_for_the_episode(envs) -> None:
    tasks = tasks_with([{"prompt": "Count.", "answer": "1"}], environment_factory=envs.Counter, reward=None)
    env = tasks.make_env(tasks.rows[0], 0)
    env.reset()
    r = tasks.renderer
    turn = env.step(
        (
            *r.tokenizer.encode(call("stall", seconds=9) + call("bump", by=1), add_special_tokens=False),
            r.end_of_turn,
        )
    )
    text = r.tokenizer.decode(turn.observation)
    assert turn.tool_timeouts == 1 and "stall did not return within 1 s and was stopped" in text
    assert "the environment instance is gone" in text
    verdict = env.verdict()
    assert (
        verdict == 0.0 and "Counter.get_reward: " in verdict.failure and "instance is gone" in verdict.failure
    )
    env.close()
    assert env.episode.host is None


def test_the_sources_call_limits_reach_each_episode_as_the_one_object_it_made(envs) -> None:
    tasks = tasks_with([{"prompt": "Count.", "answer": "1"}], environment_factory=envs.Counter, reward=None)
    env = tasks.make_env(tasks.rows[0], 0)
    try:
        assert env.episode.limits is tasks.episode_limits
        limits = tasks.episode_limits
        assert (limits.tool_timeout_s, limits.timeout_s) == (1.0, REWARD_TIMEOUT_S)
        assert limits.workers is tasks.worker_limits
    finally:
        env.close()


def test_a_class_no_worker_can_import_runs_in_a_thread_under_the_same_deadlines(envs) -> None:
    local = type("LocalCounter", (envs.Counter,), {})  # no module attribute names it
    tasks = tasks_with([{"prompt": "Count [g0].", "answer": "2"}], environment_factory=local, reward=None)
    assert tasks.environments[None].path is None
    content, rewards = run_episodes(tasks, [[call("bump", by=2), "Done"]])
    assert rewards["g0"].parts == (("LocalCounter", 1.0),) and content["g0"].tool_calls == 1
    env = tasks.make_env(tasks.rows[0], 0)
    env.reset()
    result = env.episode.call("stall", {"seconds": 9})
    assert result.timed_out and env.episode.call("bump", {"by": 1}).error.startswith(
        "the environment instance is gone"
    )
    env.close()


def test_code_no_worker_can_import_is_warned_about_and_refused_where_a_sandbox_is_required(
    envs, caplog
) -> None:
    local = type("LocalCounter", (envs.Counter,), {})

    def shout(text: str) -> str:
        """Shout.

        Args:
            text: what
        """
        return text.upper()

    rows = [{"prompt": "p", "answer": "1"}]
    with caplog.at_level("WARNING"):
        tasks_with(rows, tools=[shout], environment_factory=local, reward=None)
    assert "tool shout, environment LocalCounter: no worker can import it" in caplog.text
    with pytest.raises(ConfigError, match="worker_limits.require_sandbox refuses that"):
        tasks_with(rows, tools=[shout], reward="trl_envs:correct", worker_limits={"require_sandbox": True})


def test_a_mapping_of_classes_lets_each_row_pick_its_environment_and_its_tools(envs) -> None:
    rows = [
        {"prompt": "Count.", "answer": "1", "environment": "count"},
        {"prompt": "Look.", "answer": "1", "environment": "quiet"},
    ]
    tasks = tasks_with(
        rows, environment_factory={"count": envs.Counter, "quiet": envs.Quiet}, reward="trl_envs:correct"
    )
    assert tasks.reward_names == ("correct", "Counter")
    env = tasks.make_env(tasks.rows[1], 0)
    quiet = tasks.renderer.tokenizer.decode(env.reset())
    assert '"name": "columns"' in quiet and '"name": "bump"' not in quiet
    assert env.episode.call("columns", {}).text == "answer,prompt"  # the selecting column is not passed
    env.close()
    with pytest.raises(ConfigError, match=r"column 'environment' names environments \['chess'\]"):
        tasks_with(
            [{**rows[0], "environment": "chess"}],
            environment_factory={"count": envs.Counter},
            reward="trl_envs:correct",
        )


def test_a_reset_that_raises_fails_its_trajectory_alone(envs) -> None:
    tasks = tasks_with(
        [{"prompt": "Play [g0].", "answer": "1"}], environment_factory=envs.Broken, reward="trl_envs:correct"
    )
    content, rewards = run_episodes(tasks, [["x"]])
    assert content["g0"].finish_reason == "failure"
    assert "DatasetRowError: row 0 of " in rewards["g0"].failure
    assert "Broken.reset: RuntimeError: no board for Play [g0]." in rewards["g0"].failure


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("NoReset", "NoReset has no reset method"),
        ("Untyped", "Untyped.move.*no JSON schema"),
        ("make_counter", "give the environment's class"),
    ],
)
def test_an_environment_that_breaks_the_contract_is_refused_at_set_up(envs, factory, message) -> None:
    with pytest.raises(ConfigError, match=message):
        tasks_with(
            [{"prompt": "p", "answer": "1"}],
            environment_factory=getattr(envs, factory),
            reward="trl_envs:correct",
        )


def test_the_yaml_name_takes_module_colon_class_and_both_names_at_once_are_refused(envs) -> None:
    tasks = tasks_with([{"prompt": "p", "answer": "1"}], environment="trl_envs:Counter", reward=None)
    assert tasks.environments[None].cls is envs.Counter and tasks.reward_names == ("Counter",)
    with pytest.raises(ConfigError, match="environment_factory and environment are the same setting"):
        tasks_with(
            [{"prompt": "p", "answer": "1"}],
            environment="trl_envs:Counter",
            environment_factory=envs.Counter,
            reward=None,
        )
    with pytest.raises(ConfigError, match=r"reward=None needs an environment with get_reward"):
        tasks_with([{"prompt": "p", "answer": "1"}], environment_factory=envs.Quiet, reward=None)


def test_the_episode_bound_counts_the_text_reset_may_add(envs) -> None:
    rows = [{"prompt": "Count.", "answer": "5"}]
    plain = tasks_with(rows, tools=[envs.add], reward="trl_envs:correct", max_tool_result_chars=100)
    with_env = tasks_with(
        rows,
        tools=[envs.add],
        environment_factory=envs.Quiet,
        reward="trl_envs:correct",
        max_tool_result_chars=100,
    )
    env = with_env.make_env(with_env.rows[0], 0)
    assert (
        env.prompt_bound() == len(env.conversation.start(with_env.messages_of(with_env.rows[0]))) + 100 + 64
    )
    assert with_env.max_episode_tokens() > plain.max_episode_tokens()


def test_a_get_reward_of_none_declines_as_a_reward_functions_none_does(envs) -> None:
    rows = [{"prompt": "a", "answer": "1"}, {"prompt": "b", "answer": None}]
    alone = tasks_with(rows, fields={}, environment_factory=envs.Judge, reward=None)
    verdicts = []
    for task in alone.rows:
        env = alone.make_env(task, 0)
        env.reset()
        env.step(
            (*alone.renderer.tokenizer.encode("done", add_special_tokens=False), alone.renderer.end_of_turn)
        )
        verdicts.append(env.verdict())
        env.close()
    assert verdicts[0] == 1.0 and verdicts[0].parts == (("Judge", 1.0),) and not verdicts[0].unscorable
    assert verdicts[1] == 0.0 and verdicts[1].parts == () and verdicts[1].unscorable  # every reward declined
    both = tasks_with(rows[1:], fields={}, environment_factory=envs.Judge, reward="trl_envs:correct")
    env = both.make_env(both.rows[0], 0)
    env.reset()
    env.step((*both.renderer.tokenizer.encode("None", add_special_tokens=False), both.renderer.end_of_turn))
    verdict = env.verdict()
    env.close()
    assert verdict.parts == (("correct", 1.0),) and not verdict.unscorable  # the reward function still scores


# ------------------------------------------------------------------ eval split


def test_a_separate_eval_file_is_the_held_out_set_and_every_training_row_trains(envs, tmp_path) -> None:
    train = [{"prompt": f"t{i}", "answer": str(i)} for i in range(30)]
    held = tmp_path / "test.jsonl"
    held.write_text("".join(json.dumps({"prompt": f"e{i}", "answer": str(i)}) + "\n" for i in range(3)))
    for key in ("eval_dataset", "val_path"):
        tasks = DatasetTasks(train, fields={"answer": "answer"}, **{key: str(held)})
        assert [t.row["prompt"] for t in tasks.validation_tasks()] == ["e0", "e1", "e2"]
        sampled = {t.row["prompt"] for t in tasks.tasks(0, 300, seed=0)}
        assert sampled == {f"t{i}" for i in range(30)}
    in_memory = DatasetTasks(
        train, fields={"answer": "answer"}, eval_dataset=[{"prompt": "m", "answer": "1"}]
    )
    (task,) = in_memory.validation_tasks()
    assert task.held_out and in_memory.make_env(task, 0).reset()
    assert len(DatasetTasks(train, fields={"answer": "answer"}).validation_tasks()) > 0  # the default 10%


def test_an_eval_set_that_no_validation_would_run_is_warned_about(envs) -> None:
    from thundersync_lightning.modules import RolloutDataModule
    from thundersync_lightning.rollout import EmbeddedEngineConfig

    tasks = DatasetTasks([{"prompt": "t", "answer": "1"}], eval_dataset=[{"prompt": "e", "answer": "1"}])
    with pytest.warns(
        UserWarning,
        match=r"separate eval set \(the given rows\) that no validation will run; set val_samples > 0",
    ):
        RolloutDataModule(tasks=tasks, engine=EmbeddedEngineConfig(), val_samples=0)


def test_an_eval_file_with_a_val_fraction_or_without_a_mapped_column_is_refused(envs, tmp_path) -> None:
    train = [{"prompt": "t", "answer": "1"}]
    with pytest.raises(ConfigError, match="val_fraction=0.2 with a separate eval set"):
        DatasetTasks(
            train,
            fields={"answer": "answer"},
            eval_dataset=[{"prompt": "e", "answer": "1"}],
            val_fraction=0.2,
        )
    with pytest.raises(ConfigError, match=r"lacks mapped columns: answer -> column 'answer'"):
        DatasetTasks(train, fields={"answer": "answer"}, eval_dataset=[{"prompt": "e"}])
    with pytest.raises(ConfigError, match="eval_dataset and val_path are the same setting"):
        DatasetTasks(train, eval_dataset=train, val_path="x.jsonl")
