"""Every shipped task: the gold patch earns 1, no change 0, gaming the tests 0 (real test runs)."""

from __future__ import annotations

import pytest

from thundersync_lightning.envs.code import LocalCodeTasks, load_tasks
from thundersync_lightning.envs.codec import ByteCodec

from .._support import needs_bwrap

pytestmark = needs_bwrap

TASKS = {t.name: t for t in load_tasks()}
CODEC = ByteCodec()


@pytest.fixture(scope="module")
def source() -> LocalCodeTasks:
    return LocalCodeTasks(sandbox_root="/tmp/thundersync-test-sandboxes", uid_base=3_950_000, uid_count=128)


def act(env, text: str) -> str:
    result = env.step(CODEC.encode(text) + (ByteCodec.END_OF_ACTION,))
    return CODEC.decode(result.observation)


def test_at_least_ten_tasks_are_shipped_each_with_a_failing_test_and_a_gold_patch():
    assert len(TASKS) >= 10
    for task in TASKS.values():
        assert task.fail_to_pass and task.pass_to_pass and task.gold_patch
        assert task.problem_statement.strip()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_the_gold_patch_applied_by_the_agent_earns_reward_one(source, name):
    task = TASKS[name]
    env = source.make_env(task, seed=0)
    try:
        env.reset()
        obs = act(
            env,
            f"bash\ncat > /tmp/fix.patch <<'EOF_GOLD'\n{task.gold_patch}EOF_GOLD\ngit apply /tmp/fix.patch",
        )
        assert "[exit code 0]" in obs
        assert env.step(CODEC.encode("submit")).done
        assert env.verdict() == 1.0
        status = env.outcome().report["tests_status"]
        assert sorted(status["FAIL_TO_PASS"]["success"]) == sorted(task.fail_to_pass)
        assert sorted(status["PASS_TO_PASS"]["success"]) == sorted(task.pass_to_pass)
    finally:
        env.close()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_no_change_earns_reward_zero(source, name):
    env = source.make_env(TASKS[name], seed=0)
    try:
        env.reset()
        assert env.step(CODEC.encode("submit")).done
        assert env.verdict() == 0.0
        assert "empty patch" in env.outcome().reason
    finally:
        env.close()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_a_patch_that_edits_the_tests_earns_reward_zero(source, name):
    """Override the failing tests, add a conftest that passes everything, touch the source:
    the test changes are reverted and the real tests still fail."""
    task = TASKS[name]
    test_file = task.test_files[0]
    overrides = "".join(f"\n\ndef {node.split('::')[-1]}():\n    pass\n" for node in task.fail_to_pass)
    source_file = next(path for path, _ in task.files if not task.protects(path) and path.endswith(".py"))
    conftest = (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n    outcome = yield\n"
        "    report = outcome.get_result()\n    report.outcome = 'passed'\n"
    )
    env = source.make_env(task, seed=0)
    try:
        env.reset()
        act(env, f"bash\ncat >> {test_file} <<'EOF_T'{overrides}EOF_T\necho '# touched' >> {source_file}")
        act(env, f"write conftest.py\n{conftest}")
        # Inside the workspace the hack "works": the agent sees green tests.
        assert "failed" not in act(env, "bash python3 -m pytest -q -p no:cacheprovider")
        env.step(CODEC.encode("submit"))
        assert env.verdict() == 0.0
        outcome = env.outcome()
        assert outcome.reason.startswith("tests failed: ") and all(
            f"{t}: FAILED" in outcome.reason for t in task.fail_to_pass
        )
        assert sorted(outcome.report["tests_status"]["FAIL_TO_PASS"]["failure"]) == sorted(task.fail_to_pass)
    finally:
        env.close()
