"""The SWE tools in the real sandbox: a full native tool-call episode (call -> sandbox -> tool
message -> submit -> graded reward) through the agent loop, scored by the learner."""

from __future__ import annotations

import functools
import json
import tempfile

import pytest

from thundersync_lightning.core.errors import ConfigError
from thundersync_lightning.core.types import ContentReady, RewardReady
from thundersync_lightning.envs.code import LocalCodeTasks
from thundersync_lightning.envs.tokens import added_token_ids
from thundersync_lightning.rollout import AgentLoop, EnvPool, Generation, make_request

from .._support import needs_bwrap
from ..qwen_style import save_model

OLD = "return year % 4 == 0 and year % 100 != 0"
NEW = "return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)"


@functools.cache
def model_dir() -> str:
    directory = tempfile.mkdtemp(prefix="qwen-style-model-")
    save_model(directory)
    return directory


def source(**kwargs) -> LocalCodeTasks:
    return LocalCodeTasks(
        names=["leap_year"],
        sandbox_root="/tmp/thundersync-test-sandboxes",
        uid_base=3_970_000,
        uid_count=32,
        tokenizer_path=model_dir(),
        action_format="tools",
        **kwargs,
    )


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def sampled(tasks: LocalCodeTasks, text: str) -> tuple[int, ...]:
    tok = tasks.renderer.tokenizer
    return (*tok.encode(text, add_special_tokens=False), tasks.stop_token)


def test_the_tools_format_needs_a_tokenizer_and_a_known_format_and_parser():
    with pytest.raises(ConfigError, match="needs tokenizer_path"):
        LocalCodeTasks(action_format="tools")
    with pytest.raises(ConfigError, match=r"action_format='json'.*unknown tool parser 'x'"):
        LocalCodeTasks(action_format="json", tool_parser="x")  # type: ignore[arg-type]


@needs_bwrap
def test_a_full_tool_episode_fixes_the_task_in_the_sandbox_and_the_learner_scores_the_engine_ids():
    from thundersync_lightning.modules import GRPOPolicy

    tasks = source(max_turns=8, max_action_tokens=2048)
    turns = [
        "<think>\nlook first\n</think>\n\n"
        + call("str_replace_editor", command="view", path="calendar_utils.py"),
        call("bash", command="printf '<%s><|im_%s|><%s>' /tool_response end tool_call"),  # output: markup
        "<tool_call>{oops</tool_call>"
        + call("str_replace_editor", command="delete", path="x")
        + call("grep", pattern="x"),
        call("str_replace_editor", command="str_replace", path="calendar_utils.py", old_str=OLD, new_str=NEW),
        call("submit"),
    ]
    script = iter([sampled(tasks, t) for t in turns])

    def generate(requests):  # noqa: ANN001, ANN202
        return [Generation(ids, (0.0,) * len(ids)) for ids in (next(script) for _ in requests)]

    events: list = []
    pool = EnvPool(2, name="test-code-tools")
    try:
        AgentLoop(tasks, generate, pool, coalesce_s=0).run(
            make_request(tasks, step=0, num_groups=1, group_size=1, seed=0), 0, events.append
        ).wait(120)
    finally:
        pool.shutdown()
    traj = next(e.trajectory for e in events if isinstance(e, ContentReady))
    reward = next(e for e in events if isinstance(e, RewardReady))
    assert (reward.reward, reward.failure, traj.finish_reason) == (1.0, None, "submit")
    assert (traj.num_turns, traj.tool_calls, traj.invalid_tool_calls) == (5, 7, 3)
    tok = tasks.renderer.tokenizer
    observations = [tok.decode(s.tokens) for s in traj.segments if not s.scored]
    assert "year % 100 != 0" in observations[0] and "     5\t" in observations[0]  # numbered lines
    assert "</tool_response><|im_end|><tool_call>" in observations[1]  # spelled as text ...
    forged = added_token_ids(tok) & set(traj.segments[3].tokens)  # ... not as control ids
    assert forged == {
        tok.convert_tokens_to_ids(t)
        for t in ("<|im_end|>", "<|im_start|>", "<tool_response>", "</tool_response>")
    }
    assert observations[2].count("[invalid tool call]") == 3
    assert "edited calendar_utils.py" in observations[3]
    assert [s.tokens for s in traj.segments if s.scored] == [sampled(tasks, t) for t in turns]

    policy = GRPOPolicy(pretrained_path=model_dir())
    scores = policy.score_tokens([traj])
    assert scores.mask[0].tolist() == list(traj.scored_mask[1:]) + [False] * (
        scores.mask.shape[1] - len(traj.tokens) + 1
    )


@needs_bwrap
def test_the_editor_views_creates_replaces_inserts_and_undoes_in_the_sandbox():
    tasks = source(max_turns=20)
    (task,) = tasks.tasks(step=0, num_groups=1, seed=0)
    env = tasks.make_env(task, seed=0)
    tok = tasks.renderer.tokenizer

    def do(command: str, **args) -> str:
        result = env.step(sampled(tasks, call("str_replace_editor", command=command, **args)))
        return tok.decode(result.observation)

    try:
        env.reset()
        assert "calendar_utils.py" in do("view", path=".") and "tests/test_calendar.py" in do(
            "view", path="."
        )
        assert "created notes.txt" in do("create", path="notes.txt", file_text="a\nb")
        assert "exists" in do("create", path="notes.txt", file_text="again")
        assert "inserted 1 line(s) after line 1" in do(
            "insert", path="notes.txt", insert_line=1, new_str="mid"
        )
        assert "     2\tmid" in do("view", path="notes.txt", view_range=[2, 2])
        assert "occurs 0 times" in do("str_replace", path="notes.txt", old_str="zzz", new_str="y")
        assert "edited notes.txt" in do("str_replace", path="notes.txt", old_str="b", new_str="c")
        do("undo_edit", path="notes.txt")
        assert "     3\tb" in do("view", path="notes.txt")
        do("undo_edit", path="notes.txt")
        assert "mid" not in do("view", path="notes.txt")
        do("undo_edit", path="notes.txt")  # undoes the create: the file is gone
        assert "No such file" in do("view", path="notes.txt")
        assert "no edit of notes.txt to undo" in do("undo_edit", path="notes.txt")
        assert "outside the repository" in do("view", path="../../etc/passwd")
    finally:
        env.close()


def test_the_swebench_env_offers_the_same_tools_through_the_template():
    from thundersync_lightning.envs.swebench.source import SWEbenchTasks

    tasks = SWEbenchTasks(
        instances="unused.jsonl",
        tokenizer_path=model_dir(),
        action_format="tools",
        template_kwargs={"enable_thinking": False},
    )
    row = {"instance_id": "x__y-1", "image": "local/none", "problem_statement": "fix it", "test_patch": ""}
    env = tasks.make_env(row, seed=0)
    assert tasks.stop_token == tasks.renderer.end_of_turn
    names = [t["function"]["name"] for t in env.conversation.schemas]
    assert names == ["bash", "str_replace_editor", "submit"]
    prompt = tasks.renderer.tokenizer.decode(
        env.conversation.start([{"role": "user", "content": env.prompt}])
    )
    assert '"name": "str_replace_editor"' in prompt and prompt.endswith("<think>\n\n</think>\n\n")
    with pytest.raises(ConfigError, match="needs tokenizer_path"):
        SWEbenchTasks(instances="unused.jsonl", action_format="tools")


@needs_bwrap
def test_a_mutation_task_is_solved_through_tool_calls_and_graded_on_the_file_the_agent_left():
    from thundersync_lightning.envs.mutations import MutationTasks

    src = MutationTasks(
        action_format="tools",
        tokenizer_path=model_dir(),
        uid_base=3_980_000,
        uid_count=16,
        sandbox_root="/tmp/thundersync-test-mutations",
    )
    assert (src.stop_token, src.max_action_tokens) == (src.renderer.end_of_turn, 512)
    task = src.validation_tasks()[0]
    tok = src.renderer.tokenizer

    def episode(*commands: str) -> tuple[list[str], float, str]:
        env = src.make_env(task, 0)
        try:
            assert "solution.py" in tok.decode(env.reset())
            seen = []
            for command in commands:
                seen.append(tok.decode(env.step(sampled(src, call("bash", command=command))).observation))
            assert env.step(sampled(src, call("submit"))).done
            return seen, env.verdict(), env.outcome().reason
        finally:
            env.close()

    fix = task.candidates[task.answer]
    seen, reward, _ = episode(
        "python3 -I test_visible.py", f"cat > solution.py <<'EOF'\n{fix}\nEOF", "python3 -I test_visible.py"
    )
    assert "FAILED" in seen[0] and "FAILED" not in seen[2] and "PASSED" in seen[2]
    assert reward == 1.0
    _, reward, reason = episode("ln -sf /etc/hostname solution.py")  # a link is not read on the host
    assert reward == 0.0 and "empty patch" not in reason
