"""Grading through swebench's own log parser and FAIL_TO_PASS/PASS_TO_PASS report.

The log handed to swebench is always framed by the host: the test-output markers and the test
command's exit status come from the sandbox result, never from the sandboxed output. For local
tasks the body is rebuilt from the runner's nonce-framed results (:mod:`.runner`), so nothing the
code under test prints can reach the parser. swebench's verdict is then held to the rule of
:mod:`.outcomes` (a graded test passes only if it ran and passed; an expected failure or a skip
counts only where the task's original source marks the test so). Patch hygiene (which files a
patch touches, what is dropped) lives in :mod:`.patches`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..sandbox.base import SandboxResult
from .outcomes import judge_statuses
from .patches import filter_patch, split_patch
from .runner import RunnerResults, check_exit, parse_results

__all__ = [
    "EvalOutcome",
    "split_patch",
    "filter_patch",
    "framed_log",
    "runner_log",
    "grade_log",
    "grade_with_spec",
    "grade_runner_run",
]

_MAX_REASONS = 8


@dataclass(frozen=True, slots=True)
class EvalOutcome:
    """What a verdict found: ``resolved`` is the reward; ``report`` is swebench's report dict."""

    resolved: bool
    reason: str
    report: dict[str, Any] = field(default_factory=dict)
    log: str = ""

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0


def framed_log(result: SandboxResult, body: str | None = None, exit_status: int | None = None) -> str:
    """``body`` (default: the command's output) between swebench's markers, with ``exit_status``
    (default: the one the host observed) and swebench's error marker when we stopped the run."""
    from swebench.harness.constants import (
        END_TEST_OUTPUT,
        START_TEST_OUTPUT,
        TEST_EXIT_CODE,
        TESTS_ERROR,
        TESTS_TIMEOUT,
    )

    code = result.exit_code if exit_status is None else exit_status
    code = "-1" if code is None or result.timed_out or result.truncated else str(code)
    # A run we stopped (deadline, output cap) has no trustworthy results: swebench's markers say so.
    note = f"\n{TESTS_TIMEOUT}\n" if result.timed_out else f"\n{TESTS_ERROR}\n" if result.truncated else ""
    body = result.text if body is None else body
    return f"{START_TEST_OUTPUT}\n{body}\n{END_TEST_OUTPUT}\n{TEST_EXIT_CODE}: {code}\n{note}"


def runner_log(results: RunnerResults, result: SandboxResult) -> str:
    """The log swebench grades for a local task: only the runner's own result lines, host-framed."""
    return framed_log(result, results.log_body())


def grade_with_spec(
    test_spec: Any, log: str, model_patch: str, declared: Mapping[str, str] | None = None
) -> EvalOutcome:
    """``swebench.harness.grading.get_eval_report`` on ``log`` (written to a temporary file), held
    to the rule of :mod:`.outcomes`: ``declared`` is the original source of the graded test files
    (path -> text, read on the host from the task, never from the run; None: no file marks any
    test, so every graded id must pass)."""
    from swebench.harness import grading

    fd, path = tempfile.mkstemp(prefix="tsl-eval-", suffix=".log")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(log)
        prediction = {
            "instance_id": test_spec.instance_id,
            "model_name_or_path": "thundersync",
            "model_patch": model_patch,
        }
        report = grading.get_eval_report(test_spec, prediction, path, include_tests_status=True)
        status_map, found = grading.get_logs_eval(test_spec, path)
    finally:
        os.unlink(path)
    entry = report[test_spec.instance_id]
    resolved = bool(entry.get("resolved"))
    graded = list(test_spec.FAIL_TO_PASS) + list(test_spec.PASS_TO_PASS)
    problems = judge_statuses(
        status_map if found else {},
        graded,
        declared or {},
        missing_fails=getattr(test_spec.eval_type, "value", test_spec.eval_type) != "fail_only",
        resolve=getattr(grading, "_resolve_case", None),
    )
    if resolved and problems:
        resolved = False
        entry = {**entry, "resolved": False}
    if problems:
        entry = {**entry, "outcome_problems": problems}
    shown = "; ".join(problems[:_MAX_REASONS]) + (
        f"; ... {len(problems) - _MAX_REASONS} more" if len(problems) > _MAX_REASONS else ""
    )
    if resolved:
        reason = "resolved"
    else:
        reason = "tests failed" if entry.get("patch_successfully_applied") else "no parseable test results"
        reason += f": {shown}" if problems else ""
    return EvalOutcome(resolved, reason, entry, log)


def grade_log(
    instance_id: str,
    log: str,
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    model_patch: str,
    log_parser: str = "parse_log_pytest",
    declared: Mapping[str, str] | None = None,
) -> EvalOutcome:
    """Grade a framed pytest log against FAIL_TO_PASS / PASS_TO_PASS with swebench's functions
    (``declared``: see :func:`grade_with_spec`)."""
    from swebench.types import TestSpec

    spec = TestSpec(
        instance_id=instance_id,
        image="",
        eval_script_list=[],
        repo="local/" + instance_id,
        version="0",
        FAIL_TO_PASS=list(fail_to_pass),
        PASS_TO_PASS=list(pass_to_pass),
        log_parser=log_parser,
        eval_type="pass_and_fail",
    )
    return grade_with_spec(spec, log, model_patch, declared)


def grade_runner_run(
    instance_id: str,
    result: SandboxResult,
    key: str,
    fail_to_pass: Sequence[str],
    pass_to_pass: Sequence[str],
    model_patch: str,
    declared: Mapping[str, str] | None = None,
) -> EvalOutcome:
    """Grade one run of the local runner (:func:`.runner.runner_command`, ``key`` on its stdin):
    only the reporter's verified lines count, cross-checked against the exit status the host
    observed (:func:`.runner.check_exit`); a run we stopped (deadline, output cap) keeps whatever
    verified, framed as stopped."""
    results = parse_results(result.text, key)
    if results.problem is None and not (result.timed_out or result.truncated or result.cancelled):
        results = check_exit(results, result.exit_code)
    if results.problem is not None and not (result.timed_out or result.truncated):
        return EvalOutcome(False, f"no trustworthy test results: {results.problem}", log=result.text)
    return grade_log(
        instance_id, runner_log(results, result), fail_to_pass, pass_to_pass, model_patch, declared=declared
    )
