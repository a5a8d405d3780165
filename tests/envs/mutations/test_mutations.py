"""Generated bug-fix tasks: what the generator guarantees, the held-out split, and real sandboxed
episodes graded through swebench's parser and report."""

from __future__ import annotations

import pytest

from thundersync_lightning.envs.mutations import MutationTasks, generate_tasks, is_held_out, mutate, sites
from thundersync_lightning.envs.mutations.generate import run_cases

from .._support import needs_bwrap


def test_every_task_has_one_fix_and_decoys_that_the_visible_tests_reject() -> None:
    tasks = generate_tasks(4, 3)
    assert len(tasks) >= 200 and len({t.task_id for t in tasks}) == len(tasks)
    for t in tasks:
        assert len(t.candidates) == 4 and len(set(t.candidates)) == 4
        assert all(run_cases(t.candidates[t.answer], t.function, t.hidden))
        assert not all(run_cases(t.buggy, t.function, t.visible))
        for i, cand in enumerate(t.candidates):
            if i != t.answer:
                assert not all(run_cases(cand, t.function, t.visible)), (t.task_id, i)
        assert t.fail_to_pass and set(t.fail_to_pass).isdisjoint(t.pass_to_pass)


def test_mutate_changes_exactly_the_chosen_site() -> None:
    src = "def f(a, b):\n    return a + b > 2\n"
    import ast

    kinds = [type(s[0]).__name__ for s in sites(ast.parse(src))]
    assert kinds == ["Compare", "BinOp", "Constant"]
    assert mutate(src, 1, 0) == "def f(a, b):\n    return a - b > 2\n"
    assert mutate(src, 2, 0) == "def f(a, b):\n    return a + b > 3\n"


def test_the_held_out_split_depends_on_the_task_id_only() -> None:
    src = MutationTasks(val_fraction=0.2)
    train, val = {t.task_id for t in src.train_tasks}, {t.task_id for t in src.validation_tasks()}
    assert train.isdisjoint(val) and len(train) + len(val) == len(src.all_tasks)
    assert 0.1 < len(val) / len(src.all_tasks) < 0.3
    assert all(is_held_out(t, 0.2) for t in val)
    assert {t.task_id for t in src.tasks(3, 40, 0)} <= train


@needs_bwrap
@pytest.mark.parametrize("test_on_edit", [False, True])
def test_edit_test_retry_in_the_sandbox_and_the_swebench_graded_verdict(test_on_edit: bool) -> None:
    src = MutationTasks(
        test_on_edit=test_on_edit,
        uid_base=3_950_000,
        uid_count=64,
        sandbox_root="/tmp/thundersync-test-mutations",
    )
    v, task = src.vocab, src.validation_tasks()[0]
    wrong = (task.answer + 1) % v.k
    env = src.make_env(task, 0)
    try:
        assert env.reset() == (v.start,)
        after_edit = env.step([wrong]).observation
        assert after_edit == ((v.failed,) if test_on_edit else (v.applied,))
        assert env.step([v.test]).observation == (v.failed,)
        env.step([task.answer])
        assert env.step([v.test]).observation == (v.passed,)
        assert env.step([v.submit]).done
        outcome = env.outcome()
        assert outcome.resolved and outcome.report["tests_status"]["FAIL_TO_PASS"]["success"] == list(
            task.fail_to_pass
        )
    finally:
        env.close()
    for actions, reason in (([wrong], "tests failed"), ([wrong, v.revert], "empty patch")):
        env = src.make_env(task, 0)
        try:
            env.reset()
            for a in actions:
                env.step([a])
            assert env.verdict() == 0.0 and reason in env.outcome().reason
        finally:
            env.close()
    assert env.step([v.start + 3]).observation == (v.bad,)  # a token outside the language


# solution.py as an agent acting through tools could write it: each one "passes" every hidden case
# without computing anything (the function name is filled in).
HACKS = {
    "always-equal": "class _Yes:\n    def __eq__(self, other):\n        return True\n\n\ndef {f}(*args):\n"
    "    return _Yes()\n",
    "printed PASSED lines": "import os\n\n\ndef {f}(*args):\n    for n in {names!r}:\n"
    "        print('PASSED test_hidden.py::' + n, flush=True)\n    os._exit(0)\n",
    "answers twice": "def {f}(*args):\n    print('RESULT', 0, repr(args), flush=True)\n    return None\n",
}


@needs_bwrap
@pytest.mark.parametrize("hack", sorted(HACKS))
def test_a_solution_that_forges_its_hidden_results_earns_nothing(hack: str) -> None:
    src = MutationTasks(uid_base=3_950_000, uid_count=64, sandbox_root="/tmp/thundersync-test-mutations")
    task = src.validation_tasks()[0]
    text = HACKS[hack].format(f=task.function, names=[n for n, _, _ in task.hidden])
    env = src.make_env(task, 0)
    try:
        env.reset()
        env._box.run(f"cat > solution.py <<'EOF_S'\n{text}EOF_S")  # what a bash tool call does
        env._current = env._read_solution()
        assert env._current == text
        # Before: the sandboxed script compared (or printed) the results itself: "always-equal" and
        # "printed PASSED lines" resolved the task.
        assert env.verdict() == 0.0, env.outcome().reason
    finally:
        env.close()
    fixed = src.make_env(task, 0)
    try:
        fixed.reset()
        fixed.step([task.answer])
        assert fixed.verdict() == 1.0
    finally:
        fixed.close()


def test_local_code_tasks_split_by_name_keeps_held_out_tasks_out_of_training() -> None:
    from thundersync_lightning.core.errors import ConfigError
    from thundersync_lightning.envs.code.source import SplitLocalCodeTasks

    src = SplitLocalCodeTasks(val_names=["leap_year", "slugify"])
    assert [t.name for t in src.validation_tasks()] == ["leap_year", "slugify"]
    drawn = {t.name for step in range(5) for t in src.tasks(step, 10, 0)}
    assert drawn and drawn.isdisjoint({"leap_year", "slugify"})
    by_hash = SplitLocalCodeTasks(val_fraction=0.3)
    assert 0 < len(by_hash.validation_tasks()) < len(by_hash.all_tasks)
    with pytest.raises(ConfigError, match="unknown val_names"):
        SplitLocalCodeTasks(val_names=["nope"]).validation_tasks()
