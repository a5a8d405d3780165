"""``max_episode_tokens()`` of the sandboxed task families against adversarial policies.

The memory planner sizes activations with a task source's ``max_episode_tokens()``; it must hold
whatever the policy writes. Each family here runs real episodes (bubblewrap sandboxes) through the
agent loop under policies that write the longest actions, commands whose output floods (ASCII,
binary read as U+FFFD, multi-byte text), invalid actions and calls, and many calls per turn; every
episode's tokens stay within the declared bound. Toy and branch tasks:
``tests/envs/tools/test_tools_turn_budget.py``.

Before: code and mutation tasks declared no bound (the planner took only the model's context), and
a tools-format code turn's observation had no token cap (binary output tripled its tokens).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thundersync_lightning.envs.code import LocalCodeTasks
from thundersync_lightning.envs.codec import ByteCodec
from thundersync_lightning.envs.mutations import MutationTasks
from thundersync_lightning.envs.mutations.source import OBSERVATION_BYTES
from thundersync_lightning.envs.repo.episode import OBSERVATION_FRAME_BYTES
from thundersync_lightning.envs.repo.tools import turn_token_budget
from thundersync_lightning.rollout import Generation, GenerationRequest

from ._support import needs_bwrap
from .repo.test_tools import model_dir
from .tools.test_tools_turn_budget import _episodes, call

FLOODS = ("yes | head -c 100000", "head -c 5000 /dev/urandom", "python3 -c \"print('\\u00e9' * 3000)\"")

TEXT_ACTIONS = [  # the action language of envs/repo/actions.py
    *(f"bash {c}" for c in FLOODS),
    "\u00e9" * 400 + " not an action",
    "edit solution.py\n" + "x" * 3000,
    "bash " + "echo " * 1000,
]

TOOL_TURNS = [
    *(call("bash", command=c) * 12 for c in FLOODS),  # floods, more calls than a turn runs
    call("nope" + "x" * 200, path="y" * 500) * 10,
    call("bash", command=5) + call("str_replace_editor", command="view") * 4,  # schema failures
    "<tool_call>{" * 200,
    call("str_replace_editor", command="create", path="big.txt", file_text="\u00e9" * 2000)
    + call("str_replace_editor", command="view", path="big.txt") * 3,
    call("str_replace_editor", command="view", path="."),
]


def adversary(
    kind: str, texts: Sequence[str], encode: Callable[[str], Sequence[int]], vocab: int, seed: int
) -> Callable[[Sequence[GenerationRequest]], list[Generation]]:
    """Up to each request's budget: random ids, or a given text's ids; with or without the stop token."""
    rng = random.Random(seed)

    def generate(requests: Sequence[GenerationRequest]) -> list[Generation]:
        out = []
        for req in requests:
            if kind == "random":
                ids = [rng.randrange(vocab) for _ in range(req.max_new_tokens)]
            else:
                ids = list(encode(rng.choice(texts)))[: req.max_new_tokens]
            if req.stop_token is not None and rng.random() < 0.5 and len(ids) < req.max_new_tokens:
                ids.append(req.stop_token)
            out.append(Generation(tuple(ids), (0.0,) * len(ids)))
        return out

    return generate


def check_bound(tasks: object, generate: object, prompt_floor: int, observation_cap: int) -> None:
    """Every episode within ``max_episode_tokens()``, and each of its observations within the
    per-turn cap the bound counts (so a turn over it cannot hide behind shorter ones)."""
    bound = tasks.max_episode_tokens()  # type: ignore[attr-defined]
    trajectories = _episodes(tasks, generate, groups=1, size=2)
    lengths = [len(t.tokens) for t in trajectories]
    assert lengths and all(n <= bound for n in lengths), (lengths, bound)
    observations = [len(s.tokens) for t in trajectories for s in t.segments if not s.scored]
    assert all(n <= observation_cap for n in observations), (observations, observation_cap)
    assert max(lengths) > prompt_floor  # the episodes acted (a bound on prompts alone would not do)


CODE = dict(
    names=["leap_year"],
    sandbox_root="/tmp/thundersync-test-sandboxes",
    uid_base=3_940_000,
    uid_count=16,
    max_turns=2,
    max_action_tokens=600,
    max_observation_bytes=512,
)
EXAMPLES = settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.fixture(scope="module")
def tokenizer_dir() -> str:
    return model_dir()


@needs_bwrap
@EXAMPLES
@given(
    kind=st.sampled_from(["random", "texts"]),
    seed=st.integers(0, 2**16),
    codec=st.sampled_from(["bytes", "hf"]),
)
def test_no_text_format_code_episode_exceeds_max_episode_tokens(tokenizer_dir, kind, seed, codec):
    tasks = LocalCodeTasks(**CODE, **({"tokenizer_path": tokenizer_dir} if codec == "hf" else {}))
    encode = tasks.codec.encode
    check_bound(
        tasks,
        adversary(kind, TEXT_ACTIONS, encode, tasks.codec.vocab_size, seed),
        len(encode(tasks._prompt(tasks.all_tasks[0]))),
        512 + OBSERVATION_FRAME_BYTES,
    )


@needs_bwrap
@EXAMPLES
@given(kind=st.sampled_from(["random", "texts"]), seed=st.integers(0, 2**16))
def test_no_tools_format_code_episode_exceeds_max_episode_tokens(tokenizer_dir, kind, seed):
    tasks = LocalCodeTasks(**CODE, tokenizer_path=tokenizer_dir, action_format="tools")
    tok = tasks.renderer.tokenizer
    cap = turn_token_budget(tasks.renderer, 512)
    check_bound(
        tasks,
        adversary(kind, TOOL_TURNS, lambda t: tok.encode(t, add_special_tokens=False), len(tok), seed),
        tasks.max_episode_tokens() - 2 * (600 + cap),
        cap,
    )


@needs_bwrap
@EXAMPLES
@given(seed=st.integers(0, 2**16))
def test_no_one_token_mutation_episode_exceeds_max_episode_tokens(seed):
    tasks = MutationTasks(
        max_turns=4, uid_base=3_945_000, uid_count=16, sandbox_root="/tmp/thundersync-test-mutations"
    )
    check_bound(tasks, adversary("random", (), list, tasks.vocab_size + 3, seed), 1, 1)


@needs_bwrap
@EXAMPLES
@given(kind=st.sampled_from(["random", "texts"]), seed=st.integers(0, 2**16))
def test_no_tools_format_mutation_episode_exceeds_max_episode_tokens(tokenizer_dir, kind, seed):
    tasks = MutationTasks(
        max_turns=2,
        max_action_tokens=600,
        action_format="tools",
        tokenizer_path=tokenizer_dir,
        uid_base=3_945_000,
        uid_count=16,
        sandbox_root="/tmp/thundersync-test-mutations",
    )
    tok = tasks.renderer.tokenizer
    cap = turn_token_budget(tasks.renderer, OBSERVATION_BYTES)
    check_bound(
        tasks,
        adversary(kind, TOOL_TURNS, lambda t: tok.encode(t, add_special_tokens=False), len(tok), seed),
        tasks.max_episode_tokens() - 2 * (600 + cap),
        cap,
    )


def test_a_byte_codec_observation_is_cut_to_its_declared_ids():
    """The text format's cut: any codec's ids of an observation are at most its bytes plus the frame."""

    class Wide(ByteCodec):  # a tokenizer spending two ids per byte
        def encode(self, text: str) -> tuple[int, ...]:
            return tuple(b for byte in text.encode() for b in (byte, byte))

    from thundersync_lightning.envs.repo.episode import CodeEnv

    env = CodeEnv(workspace=None, prompt="", codec=Wide(), max_observation_bytes=100)  # type: ignore[arg-type]
    assert len(env._observe("x" * 5000)) == 100 + OBSERVATION_FRAME_BYTES  # before: 2 * (100 + frame)


class _Idle:
    """A workspace that opens without a container (only the prompt is read here)."""

    def open(self) -> None:
        pass

    def close(self) -> None:
        pass


@pytest.mark.parametrize("fmt", ["text", "tools"])
def test_a_swebench_bound_counts_the_longest_instances_prompt_as_the_environment_renders_it(
    tokenizer_dir, tmp_path, fmt
):
    """SWE-bench shares the code environment (its episodes need containers: not run here); its bound
    is the longest instance's prompt, as ``reset`` returns it, plus the code family's per-turn caps."""
    import json

    from thundersync_lightning.envs.code.task import load_tasks
    from thundersync_lightning.envs.swebench import SWEbenchTasks

    from ._support import swebench_row

    task = load_tasks(None, ["leap_year"])[0]
    rows = [
        swebench_row(task, "img", "0" * 40),
        {
            **swebench_row(task, "img", "0" * 40),
            "instance_id": "long__1",
            "problem_statement": "\u00e9 long " * 500,
        },
    ]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    extra = {"tokenizer_path": tokenizer_dir, "action_format": "tools"} if fmt == "tools" else {}
    tasks = SWEbenchTasks(str(path), max_turns=3, max_action_tokens=100, max_observation_bytes=256, **extra)
    prompts = []
    for row in tasks.rows:
        env = tasks.make_env(row, 0)
        env.workspace = _Idle()  # type: ignore[assignment]
        prompts.append(len(env.reset()))
    per_turn = 256 + OBSERVATION_FRAME_BYTES if fmt == "text" else turn_token_budget(tasks.renderer, 256)
    assert prompts[1] > prompts[0]
    assert tasks.max_episode_tokens() == prompts[1] + 3 * (100 + per_turn)  # before: no bound declared
