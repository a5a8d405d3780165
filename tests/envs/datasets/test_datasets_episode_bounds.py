"""``DatasetTasks.max_episode_tokens()`` against adversarial policies, with the user's tools and without.

The memory planner sizes activations with it; it must hold whatever the policy writes. Episodes run
through the agent loop under policies writing random ids or the longest turns: floods (a tool whose
result is 100k emoji, four tokens each), many calls per turn, invalid JSON, unknown tools, wrong
argument types, with and without the end-of-turn token. Other families:
``tests/envs/test_envs_episode_bounds.py``.

Before: ``DatasetTasks`` declared no bound, and a tool turn's observation had no token cap.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thundersync_lightning.envs.datasets import DatasetTasks

from ..test_envs_episode_bounds import adversary, check_bound
from .test_tool_env import tokenizer_dir

FLOOD_TOOLS = '''
def flood(n: int) -> str:
    """Return n emoji (four bytes, four tokens each through a byte-level tokenizer).

    Args:
        n: how many
    """
    return "\\U0001F600" * min(abs(n), 100000)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first integer
        b: the second integer
    """
    return a + b
'''

ROWS = [
    {"prompt": "What is 2 + 3?", "answer": "never"},
    {
        "prompt": [
            {"role": "system", "content": "Be brief. " * 40},
            {"role": "user", "content": "\u00e9" * 300},
        ],
        "answer": "never",
    },
]


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


TURNS = [
    call("flood", n=100000) * 3,  # floods
    call("flood", n=100000) * 12,  # more calls than a turn runs
    call("add", a=1, b=2) * 30,
    call("nope" + "x" * 200, a="y" * 500) * 10,  # unknown tools
    call("add", a="one", b=[2]) * 5,  # wrong types
    "<tool_call>{" * 200,  # invalid JSON, deep nesting
    "\u00e9" * 400 + " no call at all",
]


def shortest_prompt(tasks: DatasetTasks) -> int:
    """The floor an episode that acted passes (``check_bound``): the shortest prompt as reset renders it."""
    return min(len(tasks.make_env(t, 0).reset()) for t in tasks.rows)


EXAMPLES = settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def tool_tasks(tmp_path_factory) -> DatasetTasks:  # noqa: ANN001
    directory = tmp_path_factory.mktemp("flood_tools")
    (directory / "flood_tools.py").write_text(FLOOD_TOOLS)
    directory.chmod(0o755)  # the tools' confined workers run as a uid of their own
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(directory))
        yield DatasetTasks(
            ROWS,
            fields={"answer": "answer"},
            tokenizer_path=tokenizer_dir(),
            tools=["flood_tools:flood", "flood_tools:add"],
            tool_timeout_s=5.0,
            max_turns=3,
            max_action_tokens=300,
            end_on_answer=False,
            val_fraction=0.0,
        )


@EXAMPLES
@given(kind=st.sampled_from(["random", "texts"]), seed=st.integers(0, 2**16))
def test_no_dataset_tool_episode_exceeds_max_episode_tokens(tool_tasks, kind, seed):
    tok = tool_tasks.renderer.tokenizer
    policy = adversary(kind, TURNS, lambda t: tok.encode(t, add_special_tokens=False), len(tok), seed)
    assert tool_tasks.turn_budget is not None and tool_tasks.turn_budget.max_tokens is not None
    check_bound(tool_tasks, policy, shortest_prompt(tool_tasks), tool_tasks.turn_budget.max_tokens)


@EXAMPLES
@given(
    kind=st.sampled_from(["random", "texts"]),
    seed=st.integers(0, 2**16),
    text=st.sampled_from(["bytes", "chat"]),
)
def test_no_dataset_feedback_episode_exceeds_max_episode_tokens(kind, seed, text):
    tasks = DatasetTasks(
        ROWS,
        fields={"answer": "answer"},
        max_turns=3,
        max_action_tokens=200,
        val_fraction=0.0,
        system_prompt="You answer questions.",
        feedback="Wrong. " * 20,
        **({"tokenizer_path": tokenizer_dir()} if text == "chat" else {}),
    )
    if text == "chat":
        tok = tasks.renderer.tokenizer
        encode, vocab = (lambda t: tok.encode(t, add_special_tokens=False)), len(tok)
    else:
        encode, vocab = tasks.codec.encode, tasks.vocab_size
    check_bound(
        tasks, adversary(kind, TURNS, encode, vocab, seed), shortest_prompt(tasks), tasks.feedback_tokens()
    )


def test_the_bound_counts_the_longest_prompt_as_reset_renders_it():
    """The second row's prompt (system message, multi-byte text) is the longer one, through the
    byte codec: the bound is its ids, plus the turns' actions and feedback."""
    tasks = DatasetTasks(
        ROWS, fields={"answer": "answer"}, max_turns=2, max_action_tokens=50, val_fraction=0.0
    )
    prompts = [len(tasks.make_env(t, 0).reset()) for t in tasks.rows]
    assert prompts[1] > prompts[0]
    assert (
        tasks.max_episode_tokens() == prompts[1] + 2 * 50 + tasks.feedback_tokens()
    )  # before: no bound declared
