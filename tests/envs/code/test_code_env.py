"""The code environment's protocol end to end, its action language, codec and TaskSource."""

from __future__ import annotations

import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from thundersync_lightning.core.protocols import Environment, TaskSource
from thundersync_lightning.envs.code import LocalCodeTasks
from thundersync_lightning.envs.codec import ByteCodec
from thundersync_lightning.envs.repo.actions import (
    ACTION_HELP,
    Bash,
    Invalid,
    ReplaceInFile,
    Submit,
    WriteFile,
    parse_action,
)
from thundersync_lightning.envs.repo.episode import format_observation
from thundersync_lightning.envs.repo.patches import filter_patch, split_patch
from thundersync_lightning.envs.sandbox import SandboxResult

from .._support import needs_bwrap

CODEC = ByteCodec()
EOA = ByteCodec.END_OF_ACTION


def make_source(**kwargs) -> LocalCodeTasks:
    return LocalCodeTasks(
        sandbox_root="/tmp/thundersync-test-sandboxes", uid_base=3_960_000, uid_count=64, **kwargs
    )


def act(env, text: str):
    return env.step(CODEC.encode(text) + (EOA,))


@needs_bwrap
def test_scripted_bash_edit_and_submit_actions_solve_a_task_end_to_end():
    source = make_source(names=["leap_year"])
    assert isinstance(source, TaskSource)
    (task,) = source.tasks(step=0, num_groups=1, seed=0)
    env = source.make_env(task, seed=0)
    assert isinstance(env, Environment)
    try:
        prompt = CODEC.decode(env.reset())
        assert task.problem_statement.strip() in prompt and ACTION_HELP in prompt
        assert "calendar_utils.py" in prompt

        result = act(env, "bash cat calendar_utils.py")
        assert not result.done and "year % 100 != 0" in CODEC.decode(result.observation)

        assert "[invalid action]" in CODEC.decode(act(env, "please fix it").observation)
        assert "[invalid action]" in CODEC.decode(act(env, "write /etc/passwd\nx").observation)
        missing = CODEC.decode(
            act(
                env, "replace calendar_utils.py\n<<<<<<< SEARCH\nnot there\n=======\nx\n>>>>>>> REPLACE"
            ).observation
        )
        assert "found 0 times" in missing

        obs = CODEC.decode(
            act(
                env,
                "replace calendar_utils.py\n<<<<<<< SEARCH\n"
                "    return year % 4 == 0 and year % 100 != 0\n=======\n"
                "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n"
                ">>>>>>> REPLACE",
            ).observation
        )
        assert "edited calendar_utils.py" in obs
        assert "wrote NOTES.md" in CODEC.decode(
            act(env, "write NOTES.md\nfixed the 400-year rule\n").observation
        )
        tests = CODEC.decode(act(env, "bash python3 -m pytest -q -p no:cacheprovider").observation)
        assert "2 passed" in tests  # the FAIL_TO_PASS test is hidden until grading
        assert "NOTES.md" in CODEC.decode(act(env, "bash git status --short").observation)

        # Tokens after the end-of-action id are ignored.
        done = env.step(CODEC.encode("submit") + (EOA,) + CODEC.encode("bash rm -rf ."))
        assert done.done and done.observation == ()
        assert env.step(CODEC.encode("bash ls")).done  # an ended episode stays ended
        assert env.verdict() == 1.0
        assert env.verdict() == 1.0  # cached, no second test run
    finally:
        env.close()
        env.close()


@needs_bwrap
def test_verdicts_run_concurrently_from_a_thread_pool_each_in_its_own_sandbox_uid():
    source = make_source()
    tasks = source.all_tasks[:4]
    envs = [source.make_env(t, seed=0) for t in tasks]
    try:
        for env in envs:
            env.reset()
        for env, task in list(zip(envs, tasks))[:2]:  # the first two solve their task
            act(env, f"bash\ncat > /tmp/p <<'EOF_P'\n{task.gold_patch}EOF_P\ngit apply /tmp/p")
        uids = {env.workspace._lease.uid for env in envs}
        assert len(uids) == len(envs)
        with ThreadPoolExecutor(max_workers=4) as pool:
            rewards = list(pool.map(lambda e: e.verdict(), envs))
        assert rewards == [1.0, 1.0, 0.0, 0.0]
    finally:
        for env in envs:
            env.close()


def test_the_task_source_pickles_and_picks_tasks_deterministically():
    source = make_source()
    clone = pickle.loads(pickle.dumps(source))
    first = [t.name for t in source.tasks(step=3, num_groups=20, seed=7)]
    assert first == [t.name for t in clone.tasks(step=3, num_groups=20, seed=7)]
    assert len(first) == 20 and set(first) == {t.name for t in source.all_tasks}
    assert first != [t.name for t in source.tasks(step=4, num_groups=20, seed=7)]
    assert source.stop_token == EOA and source.max_turns >= 1 and source.max_action_tokens >= 1
    assert pickle.loads(pickle.dumps(source.all_tasks[0])) == source.all_tasks[0]


def test_the_task_source_is_constructible_from_yaml_with_jsonargparse():
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--tasks", type=LocalCodeTasks)
    cfg = parser.parse_string(
        "tasks:\n  class_path: thundersync_lightning.envs.code.LocalCodeTasks\n"
        "  init_args:\n    names: [roman_numerals, slugify]\n    max_turns: 3\n    test_timeout_s: 30\n"
    )
    tasks = parser.instantiate_classes(cfg).tasks
    assert isinstance(tasks, LocalCodeTasks)
    assert tasks.max_turns == 3 and [t.name for t in tasks.all_tasks] == ["roman_numerals", "slugify"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("bash ls -la", Bash("ls -la")),
        ("\n bash\nset -e\nls\n", Bash("set -e\nls")),
        ("submit", Submit()),
        ("submit  \n", Submit()),
        ("write a/b.py\nx = 1\n", WriteFile("a/b.py", "x = 1\n")),
        (
            "replace m.py\n<<<<<<< SEARCH\nold\n=======\nnew\n>>>>>>> REPLACE\n",
            ReplaceInFile("m.py", "old", "new"),
        ),
    ],
)
def test_actions_parse(text, expected):
    assert parse_action(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "",
        "rm -rf /",
        "bash",
        "submit now",
        "write ../x\n1",
        "write /x\n1",
        "replace m.py\nno markers",
        "replace m.py\n<<<<<<< SEARCH\n=======\nx\n>>>>>>> REPLACE",
    ],
)
def test_unparseable_actions_are_invalid_with_a_reason(text):
    action = parse_action(text)
    assert isinstance(action, Invalid) and action.reason


@given(st.text())
def test_the_byte_codec_round_trips_text(text):
    ids = CODEC.encode(text)
    assert all(0 <= i < 256 for i in ids)
    assert CODEC.decode(ids) == text
    assert CODEC.decode(ids + (EOA, ByteCodec.PAD)) == text
    assert CODEC.vocab_size > max(EOA, ByteCodec.OBSERVATION, ByteCodec.PAD)


def test_observations_are_bounded_and_keep_head_and_tail():
    result = SandboxResult(exit_code=1, output=b"HEAD" + b"x" * 100_000 + b"TAIL")
    text = format_observation(result, max_bytes=1000)
    assert text.startswith("[exit code 1]") and "HEAD" in text and "TAIL" in text
    assert len(text.encode()) < 1100


def test_changes_to_tests_and_test_configuration_are_filtered_from_patches():
    def diff(path: str) -> str:
        return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n"

    kept = ["pkg/mod.py", "README.md"]
    dropped = [
        "tests/test_mod.py",
        "test_x.py",
        "pkg/x_test.py",
        "conftest.py",
        "pkg/conftest.py",
        "pytest.ini",
        "setup.cfg",
        "pkg/__pycache__/mod.cpython-311.pyc",
        "sitecustomize.py",
    ]
    patch = "".join(diff(p) for p in kept + dropped)
    assert [paths for paths, _ in split_patch(filter_patch(patch, make_source().all_tasks[0].protects))] == [
        ("pkg/mod.py",),
        ("README.md",),
    ]
    rename = "diff --git a/mod.py b/tests/test_mod.py\nrename from mod.py\nrename to tests/test_mod.py\n"
    assert filter_patch(rename, make_source().all_tasks[0].protects) == ""


@needs_bwrap
def test_closing_an_environment_kills_a_command_still_running_and_frees_its_uid():
    import threading

    from .._support import processes_of

    source = make_source(command_timeout_s=600.0)
    env = source.make_env(source.all_tasks[0], seed=0)
    env.reset()
    ws = env.workspace
    uid = ws._lease.uid
    fifo = os.path.join(ws._sandbox.workdir, "ready")
    os.mkfifo(fifo)
    os.chown(fifo, uid, uid)
    results = []
    worker = threading.Thread(
        target=lambda: results.append(ws.run("setsid sleep 1000 & echo go > ready; sleep 1000"))
    )
    worker.start()
    with open(fifo) as f:  # returns once the command inside the sandbox has written: it is running
        assert f.read() == "go\n"
    env.close()  # what the agent loop does after a verdict timeout
    worker.join()
    assert results[0].cancelled and results[0].exit_code is None
    assert processes_of(uid) == []
    assert ws._lease is None and ws._dir is None


@pytest.mark.parametrize("config", ["configs/code_local.yaml", "configs/swebench.yaml"])
def test_the_shipped_configs_build_their_task_sources(config):
    import yaml
    from jsonargparse import ArgumentParser

    from thundersync_lightning.envs.swebench.source import SWEbenchTasks

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    with open(os.path.join(root, config)) as f:
        tasks_cfg = yaml.safe_load(f)["data"]["tasks"]
    parser = ArgumentParser()
    parser.add_argument("--tasks", type=LocalCodeTasks | SWEbenchTasks)
    tasks = parser.instantiate_classes(parser.parse_object({"tasks": tasks_cfg})).tasks
    assert type(tasks).__name__ == tasks_cfg["class_path"].rsplit(".", 1)[1]
    assert tasks.max_turns == tasks_cfg["init_args"]["max_turns"]
    clone = pickle.loads(pickle.dumps(tasks))
    assert clone.max_action_tokens == tasks.max_action_tokens
    if isinstance(tasks, LocalCodeTasks):
        assert tasks.stop_token == EOA and len(tasks.all_tasks) >= 10


def test_a_hugging_face_tokenizer_can_replace_the_byte_codec(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from thundersync_lightning.envs.codec import HFTokenizerCodec

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(["bash ls -la\nsubmit\nreplace x.py\n"] * 10, trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>").save_pretrained(str(tmp_path))

    codec = pickle.loads(pickle.dumps(HFTokenizerCodec(str(tmp_path))))
    source = make_source(tokenizer_path=str(tmp_path))
    assert source.stop_token == codec.end_of_action == tok.token_to_id("<eos>")
    text = "bash ls -la\n"
    assert codec.decode(codec.encode(text) + (codec.end_of_action,)) == text
    assert parse_action(codec.decode(codec.encode(text))) == Bash("ls -la")
