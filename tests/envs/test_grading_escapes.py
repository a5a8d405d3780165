"""Ways out of a zero through the grader, each written as an agent would: a workspace filled to its
disk budget (grading itself failed with ENOSPC, the episode was dropped as an environment failure),
and a pytest configuration the graded run read from the agent's tree."""

from __future__ import annotations

import os

import pytest

from thundersync_lightning.envs.code import ByteCodec, LocalCodeTasks, is_protected_path

from ._support import needs_bwrap

CODEC = ByteCodec()
FIX = ("replace calendar_utils.py\n<<<<<<< SEARCH\n    return year % 4 == 0 and year % 100 != 0\n=======\n"
       "    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n>>>>>>> REPLACE")


def act(env, text: str):  # noqa: ANN001, ANN201
    return CODEC.decode(env.step(CODEC.encode(text) + (ByteCodec.END_OF_ACTION,)).observation)


@needs_bwrap
@pytest.mark.parametrize("fixed", [True, False])
def test_a_workspace_filled_to_its_disk_budget_is_graded_like_any_other(fixed):
    source = LocalCodeTasks(names=["leap_year"], sandbox_root="/tmp/thundersync-test-sandboxes", uid_base=3_960_000,
                            uid_count=64, disk_bytes=8 * 1024**2, disk_inodes=2_000)
    env = source.make_env(source.all_tasks[0], 0)
    try:
        env.reset()
        if fixed:
            assert "edited" in act(env, FIX)
        full = act(env, "bash dd if=/dev/zero of=fill bs=64k count=1000; touch more; echo done")
        assert "No space left on device" in full
        outcome = env.outcome()  # before: OSError ENOSPC while copying the repository for grading
    finally:
        env.close()
    assert outcome.resolved is fixed, outcome.reason


@pytest.mark.parametrize("path", [".pytest.ini", "pkg/.pytest.ini", "pytest.ini", "sub/setup.cfg", "tox.ini",
                                  "pyproject.toml", "a/b/conftest.py", "x.egg-info/entry_points.txt"])
def test_every_file_pytest_reads_configuration_or_plugins_from_is_protected(path):
    assert is_protected_path(path)  # before: .pytest.ini (read by pytest >= 8.1) was kept in the patch


# A plugin the work tree provides, named in an ini the install step wrote: pytest imports ini
# plugins before PYTEST_ADDOPTS's, so it runs before the reporter. It takes the key from the
# reporter's pipe, puts it back for the reporter, and turns every failure into a pass.
EVIL_PLUGIN = """
import os
import os

import pytest
fd = int(os.environ["TSL_REPORT_FD"])
key = os.read(fd, 4096)
r, w = os.pipe()
os.write(w, key)
os.close(w)
os.dup2(r, fd)
os.write(1, b"EVIL-PLUGIN-LOADED\\n")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    report.outcome, report.longrepr = "passed", None
"""
SETUP_WRITES_CONFIG = {
    "setup.cfg": 'open("setup.cfg", "w").write("[tool:pytest]\\naddopts = -p tsl_evil\\n")\n',
    ".pytest.ini": 'open(".pytest.ini", "w").write("[pytest]\\naddopts = -p tsl_evil\\n")\n',
}


@needs_bwrap
@pytest.mark.parametrize("written", sorted(SETUP_WRITES_CONFIG))
def test_a_config_the_install_step_writes_voids_the_run(tmp_path, sandbox_dir, sandbox_budget, written):
    """The container path's eval run in bubblewrap (as in test_swebench_env): the instance is NOT
    fixed; the agent's setup.py, run by the script's install step, writes an ini that loads its plugin."""
    from swebench.harness.utils import make_test_spec

    from thundersync_lightning.envs.code.pytest_config import manifest_command, parse_manifest
    from thundersync_lightning.envs.sandbox import BwrapConfig, BwrapSandbox, SandboxLimits, chown_tree
    from thundersync_lightning.envs.swebench.eval_run import (
        EVAL_DIR,
        EvalSecrets,
        eval_command,
        grade_eval_run,
        write_eval_dir,
    )
    from thundersync_lightning.envs.swebench.source import load_instances

    from ._support import TEST_POOL, git_repo, swebench_row
    from .test_swebench_env import TASK, write_jsonl

    lease = TEST_POOL.acquire()
    try:
        repo = os.path.join(sandbox_dir, "testbed")
        os.mkdir(repo)
        base = git_repo(TASK, repo)
        (instance,) = load_instances(write_jsonl([swebench_row(TASK, image="unused", base_commit=base)], str(tmp_path)))
        spec = make_test_spec(instance)
        limits = BwrapConfig(SandboxLimits(timeout_s=60, max_output_bytes=1 << 20))
        chown_tree(repo, lease.uid)
        original = parse_manifest(BwrapSandbox(repo, lease.uid, limits, budget=sandbox_budget).run(manifest_command()).text)
        for name, text in (("setup.py", SETUP_WRITES_CONFIG[written]), ("tsl_evil.py", EVIL_PLUGIN)):
            with open(os.path.join(repo, name), "w") as f:  # the agent's (unprotected) files
                f.write(text)
        chown_tree(repo, lease.uid)
        start = ": '>>>>> Start Test Output'"
        script = spec.eval_script.replace(start, f"python3 setup.py\n{start}")  # the install step
        scripts = os.path.join(sandbox_dir, "eval")
        write_eval_dir(scripts, script, spec.log_parser, "/bin/bash")
        box = BwrapSandbox(repo, lease.uid, limits, budget=sandbox_budget, ro_binds={scripts: EVAL_DIR})
        secrets = EvalSecrets.new()
        result = box.run(eval_command(), stdin=secrets.stdin())
    finally:
        lease.release()
    assert "EVIL-PLUGIN-LOADED" in result.text
    before = grade_eval_run(spec, result, secrets, TASK.gold_patch, declared=dict(TASK.files))
    assert before.resolved  # without the check: the unfixed instance is resolved, reward 1
    after = grade_eval_run(spec, result, secrets, TASK.gold_patch, declared=dict(TASK.files), config=original)
    assert not after.resolved and after.reward == 0.0
    assert f"/testbed/{written} added" in after.reason and "void run" in after.reason


@needs_bwrap
def test_a_mutation_task_whose_directory_the_agent_filled_is_graded_like_any_other():
    import json

    from thundersync_lightning.envs.mutations import MutationTasks

    from .test_code_tools import model_dir

    src = MutationTasks(action_format="tools", tokenizer_path=model_dir(), uid_base=3_980_000, uid_count=16,
                        sandbox_root="/tmp/thundersync-test-mutations", disk_bytes=4 * 1024**2, disk_inodes=500)
    task = src.validation_tasks()[0]
    tok = src.renderer.tokenizer
    fix = task.candidates[task.answer]
    env = src.make_env(task, 0)
    try:
        env.reset()
        for command in (f"cat > solution.py <<'EOF'\n{fix}\nEOF", "dd if=/dev/zero of=fill bs=64k count=200; echo x"):
            text = f'<tool_call>{json.dumps({"name": "bash", "arguments": {"command": command}})}</tool_call>'
            env.step((*tok.encode(text, add_special_tokens=False), src.stop_token))
        reward = env.verdict()  # before: writing test_hidden.py into the full directory raised ENOSPC
    finally:
        env.close()
    assert reward == 1.0


def test_the_expected_manifest_follows_the_test_patch_and_any_difference_is_named():
    import hashlib

    from thundersync_lightning.envs.code.pytest_config import config_changes, parse_manifest, with_contents

    digest = hashlib.sha256(b"old\n").hexdigest()
    original = parse_manifest(f"{digest}  /testbed/tests/conftest.py\n{digest}  /testbed/setup.cfg\n")
    patched = with_contents(original, {"tests/conftest.py": b"new\n", "tests/test_x.py": b"x", "tox.ini": None})
    assert patched["/testbed/tests/conftest.py"] == hashlib.sha256(b"new\n").hexdigest()
    assert "/testbed/tests/test_x.py" not in patched  # not a configuration file
    seen = parse_manifest(f"{patched['/testbed/tests/conftest.py']}  /testbed/tests/conftest.py\n"
                          "sha256sum: /testbed/setup.cfg: Permission denied\n"
                          f"{digest}  /testbed/.pytest.ini\n")
    assert config_changes(patched, patched) == []
    assert config_changes(patched, seen) == ["/testbed/.pytest.ini added", "/testbed/setup.cfg removed",
                                             "sha256sum: /testbed/setup.cfg: Permission denied added"]
