"""A graded test passes only if it ran and passed: code under test that marks its own tests at run
time (every way pytest allows) earns nothing; markers the task's own source carries still count."""

from __future__ import annotations

import os
import tempfile

import pytest

from thundersync_lightning.envs.code import LocalTask, load_tasks
from thundersync_lightning.envs.repo.grading import framed_log, grade_runner_run
from thundersync_lightning.envs.repo.outcomes import declared_markers, judge_statuses
from thundersync_lightning.envs.repo.runner import (
    RUNNER_DIR,
    check_exit,
    new_key,
    parse_results,
    runner_command,
    write_runner,
)
from thundersync_lightning.envs.sandbox import BwrapConfig, BwrapSandbox, SandboxLimits, chown_tree

from .._support import TEST_POOL, needs_bwrap

TASK = load_tasks(names=["leap_year"])[0]
F2P = TASK.fail_to_pass[0]

_WRAP = (
    "\n_orig_is_leap = is_leap\n\n\ndef is_leap(year):\n    if year == 2000:\n"
    "{body}    return _orig_is_leap(year)\n"
)
# Registers, from the code under test, a plugin that marks the hidden test when items are collected.
_PLUGIN = """
import gc as _gc

import pytest as _pytest


class _Marker:
    def pytest_collection_modifyitems(self, items):
        for item in items:
            if item.name == "test_divisible_by_400":
                item.add_marker({mark})


for _o in _gc.get_objects():
    if type(_o).__name__ == "Config" and hasattr(_o, "pluginmanager"):
        _o.pluginmanager.register(_Marker(), "tsl-hack")
        break
"""
# Appended to calendar_utils.py (the module under test), one way at a time.
HACKS = {
    "pytest.xfail": _WRAP.format(body="        import pytest\n        pytest.xfail('hack')\n"),
    "pytest.skip": _WRAP.format(body="        import pytest\n        pytest.skip('hack')\n"),
    "importorskip": _WRAP.format(
        body="        import pytest\n        pytest.importorskip('tsl_no_such_module')\n"
    ),
    "unittest.SkipTest": _WRAP.format(
        body="        import unittest\n        raise unittest.SkipTest('hack')\n"
    ),
    "pytest.exit": _WRAP.format(body="        import pytest\n        pytest.exit('hack', returncode=0)\n"),
    "module-level skip": "\nimport pytest\npytest.skip('hack', allow_module_level=True)\n",
    "add_marker xfail": _PLUGIN.format(mark="_pytest.mark.xfail(reason='hack')"),
    "add_marker xfail(run=False)": _PLUGIN.format(mark="_pytest.mark.xfail(run=False, reason='hack')"),
    "add_marker skip": _PLUGIN.format(mark="_pytest.mark.skip(reason='hack')"),
    "add_marker skipif": _PLUGIN.format(mark="_pytest.mark.skipif(True, reason='hack')"),
}
# What swebench alone made of the signed outcomes (before the rule): an expected failure is a pass.
RESOLVED_BEFORE = {"pytest.xfail", "add_marker xfail", "add_marker xfail(run=False)"}


def run_graded(task: LocalTask, extra: dict[str, str]):
    """The task's original repository plus ``extra`` (appended), run by the host's runner in
    bubblewrap and graded as LocalWorkspace.evaluate grades it: (outcome, verified results)."""
    budget_root = "/tmp/thundersync-test-sandboxes"
    os.makedirs(budget_root, mode=0o711, exist_ok=True)
    from thundersync_lightning.envs.sandbox.fs import BoundedDir

    budget = BoundedDir(tempfile.mkdtemp(dir=budget_root), 256 * 1024**2, 10_000, 0o711)
    lease = TEST_POOL.acquire()
    try:
        work = os.path.join(budget.path, "repo")
        os.mkdir(work)
        task.materialize(work)
        for rel, text in extra.items():
            with open(os.path.join(work, rel), "a") as f:
                f.write(text)
        chown_tree(work, lease.uid)
        runner = os.path.join(budget.path, "runner")
        write_runner(runner)
        box = BwrapSandbox(
            work,
            lease.uid,
            BwrapConfig(SandboxLimits(timeout_s=60.0, max_output_bytes=1 << 20)),
            budget=budget,
            ro_binds={runner: RUNNER_DIR},
        )
        key = new_key()
        result = box.run(runner_command(task.fail_to_pass + task.pass_to_pass), stdin=(key + "\n").encode())
    finally:
        lease.release()
        budget.remove()
    outcome = grade_runner_run(
        task.name, result, key, task.fail_to_pass, task.pass_to_pass, "x", declared=dict(task.files)
    )
    return outcome, parse_results(result.text, key)


def swebench_resolved(task: LocalTask, results) -> bool:
    """swebench's own verdict on the signed outcomes, as the grading before this rule made it."""
    from swebench.harness import grading
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id=task.name,
        image="",
        eval_script_list=[],
        repo="local/x",
        version="0",
        FAIL_TO_PASS=list(task.fail_to_pass),
        PASS_TO_PASS=list(task.pass_to_pass),
        log_parser="parse_log_pytest",
        eval_type="pass_and_fail",
    )
    fd, path = tempfile.mkstemp(suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write(framed_log(_ok(), results.log_body(), 0))
    try:
        report = grading.get_eval_report(
            spec,
            {"instance_id": task.name, "model_name_or_path": "m", "model_patch": "x"},
            path,
            include_tests_status=False,
        )
    finally:
        os.unlink(path)
    return bool(report[task.name]["resolved"])


def _ok():
    from thundersync_lightning.envs.sandbox import SandboxResult

    return SandboxResult(0, b"")


@needs_bwrap
@pytest.mark.parametrize("hack", sorted(HACKS))
def test_code_under_test_that_marks_its_own_tests_at_run_time_earns_nothing(hack):
    outcome, results = run_graded(TASK, {"calendar_utils.py": HACKS[hack]})
    if hack in RESOLVED_BEFORE:
        assert results.problem is None and swebench_resolved(TASK, results)  # before: a pass
    assert not outcome.resolved
    assert F2P in outcome.reason, outcome.reason
    status = dict((n, s) for s, n in results.lines).get(F2P)
    if status is None:  # the run ended, or the module was skipped, before the hidden test ran
        assert f"{F2P}: did not run" in outcome.reason
    else:
        assert status in ("XFAIL", "SKIPPED") and f"{F2P}: {status} at run time" in outcome.reason


@needs_bwrap
def test_the_gold_patch_still_resolves_and_markers_the_tasks_source_carries_still_count():
    declared = LocalTask(
        name="declared",
        problem_statement="p\n",
        fail_to_pass=("tests/test_m.py::test_fixed",),
        pass_to_pass=("tests/test_m.py::test_known_bug", "tests/test_m.py::TestC::test_m[1]"),
        files=(
            ("m.py", "def f():\n    return 1\n"),
            (
                "tests/test_m.py",
                "import pytest\nfrom m import f\n\n\ndef test_fixed():\n    assert f() == 1\n\n\n"
                "@pytest.mark.xfail(reason='upstream bug')\ndef test_known_bug():\n    assert f() == 2\n\n\n"
                "@pytest.mark.xfail(reason='upstream bug')\nclass TestC:\n"
                "    @pytest.mark.parametrize('x', [1])\n    def test_m(self, x):\n        assert f() == 2\n",
            ),
        ),
    )
    outcome, results = run_graded(declared, {})
    assert results.problem is None and outcome.resolved, outcome.reason
    assert dict((n, s) for s, n in results.lines)["tests/test_m.py::test_known_bug"] == "XFAIL"
    gold, _ = run_graded(
        TASK,
        {
            "calendar_utils.py": "\n\ndef is_leap(year):\n    return year % 4 == 0 and "
            "(year % 100 != 0 or year % 400 == 0)\n"
        },
    )
    assert gold.resolved and gold.reason == "resolved"


@needs_bwrap
def test_a_reporter_whose_status_table_was_replaced_in_process_disagrees_with_the_exit_status():
    forge = (
        "\nimport gc as _gc\n\n\nclass _AllPassed(dict):\n    def __setitem__(self, k, v):\n"
        "        dict.__setitem__(self, k, 'PASSED')\n\n\n"
        "for _o in _gc.get_objects():\n    if type(_o).__name__ == 'Reporter' and hasattr(_o, 'status'):\n"
        "        _o.status = _AllPassed(_o.status)\n"
    )
    outcome, results = run_graded(TASK, {"calendar_utils.py": forge})
    # Before: every line verified (the methods were not patched) and said PASSED: resolved.
    assert results.problem is None and swebench_resolved(TASK, results)
    assert not outcome.resolved and "disagrees with the reported outcomes" in outcome.reason


def test_declared_markers_are_read_from_the_tests_own_decorators_classes_pytestmark_and_body():
    src = (
        "import pytest, unittest\npytestmark = [pytest.mark.filterwarnings('ignore')]\n\n"
        "@pytest.mark.xfail\ndef test_a(): pass\n\n"
        "def test_b():\n    pytest.skip('no network')\n\n"
        "@pytest.mark.parametrize('x', [1, pytest.param(2, marks=pytest.mark.xfail)])\ndef test_c(x): pass\n"
        "\n@unittest.skip('old')\nclass TestD:\n    def test_e(self): pass\n\n"
        "class TestF(unittest.TestCase):\n    @unittest.expectedFailure\n    def test_g(self): pass\n"
        "    def test_h(self): pass\n\n"
        'def test_plain():\n    """May skip, may xfail."""\n    helper_that_may_skip = 1\n'
    )
    sources = {"t.py": src, "u.py": "pytestmark = pytest.mark.skipif(True, reason='x')\ndef test_i(): pass\n"}
    assert declared_markers(sources, "t.py::test_a") == {"xfail"}
    assert declared_markers(sources, "t.py::test_b") == {"skip"}
    assert declared_markers(sources, "t.py::test_c[2]") == {"xfail"}
    assert declared_markers(sources, "t.py::TestD::test_e") == {"skip"}
    assert declared_markers(sources, "t.py::TestF::test_g") == {"xfail"}
    assert declared_markers(sources, "t.py::TestF::test_h") == frozenset()
    assert declared_markers(sources, "u.py::test_i") == {"skip"}
    # A test that is not found, a file not in the task, or a non-pytest id: nothing is declared.
    for test_id in ("t.py::test_missing", "v.py::test_a", "test_a (t.TestCase)"):
        assert declared_markers(sources, test_id) == frozenset()
    # The rule on a status map: only PASSED, or a status its source declares.
    problems = judge_statuses(
        {"t.py::test_a": "XFAIL", "t.py::test_plain": "SKIPPED", "u.py::test_i": "ERROR"},
        ["t.py::test_a", "t.py::test_plain", "u.py::test_i", "t.py::test_b"],
        sources,
    )
    assert problems == [
        "t.py::test_plain: SKIPPED at run time, and the task's source does not mark it skip",
        "u.py::test_i: ERROR",
        "t.py::test_b: did not run",
    ]
    assert judge_statuses({}, ["t.py::test_b"], sources, missing_fails=False) == []


def test_the_exit_status_cross_check():
    from thundersync_lightning.envs.repo.runner import RunnerResults

    ok = RunnerResults((("PASSED", "a"), ("XPASS", "b")), 0, None)
    assert check_exit(ok, 0).problem is None
    assert "runner exited with 1" in check_exit(ok, 1).problem
    assert "disagrees" in check_exit(RunnerResults((("PASSED", "a"),), 1, None), None).problem
    assert "disagrees" in check_exit(RunnerResults((("FAILED", "a"),), 0, None), 0).problem
    assert check_exit(RunnerResults((("ERROR", "<collection>"),), 2, None), 2).problem is None
    assert RunnerResults((("XPASS", "b"),), 0, None).log_body() == "FAILED b\n"  # swebench knows no XPASS
