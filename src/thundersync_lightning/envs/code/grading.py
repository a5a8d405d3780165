"""Grading through swebench's own log parser and FAIL_TO_PASS/PASS_TO_PASS report.

The log handed to swebench is always framed by the host: the test-output markers and the test
command's exit status come from the sandbox result, never from the sandboxed output. For local
tasks the body is rebuilt from the runner's nonce-framed results (:mod:`.runner`), so nothing the
code under test prints can reach the parser. Patch hygiene (which files a patch touches, what is
dropped) lives in :mod:`.patches`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..sandbox.base import SandboxResult
from .patches import filter_patch, split_patch
from .runner import RunnerResults

__all__ = ["EvalOutcome", "split_patch", "filter_patch", "framed_log", "runner_log", "grade_log",
           "grade_with_spec"]


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


def grade_with_spec(test_spec: Any, log: str, model_patch: str) -> EvalOutcome:
    """``swebench.harness.grading.get_eval_report`` on ``log`` (written to a temporary file)."""
    from swebench.harness.grading import get_eval_report

    fd, path = tempfile.mkstemp(prefix="tsl-eval-", suffix=".log")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(log)
        prediction = {"instance_id": test_spec.instance_id, "model_name_or_path": "thundersync",
                      "model_patch": model_patch}
        report = get_eval_report(test_spec, prediction, path, include_tests_status=True)
    finally:
        os.unlink(path)
    entry = report[test_spec.instance_id]
    resolved = bool(entry.get("resolved"))
    if resolved:
        reason = "resolved"
    elif not entry.get("patch_successfully_applied"):
        reason = "no parseable test results"
    else:
        reason = "tests failed"
    return EvalOutcome(resolved, reason, entry, log)


def grade_log(instance_id: str, log: str, fail_to_pass: Sequence[str], pass_to_pass: Sequence[str],
              model_patch: str, log_parser: str = "parse_log_pytest") -> EvalOutcome:
    """Grade a framed pytest log against FAIL_TO_PASS / PASS_TO_PASS with swebench's functions."""
    from swebench.types import TestSpec

    spec = TestSpec(instance_id=instance_id, image="", eval_script_list=[], repo="local/" + instance_id,
                    version="0", FAIL_TO_PASS=list(fail_to_pass), PASS_TO_PASS=list(pass_to_pass),
                    log_parser=log_parser, eval_type="pass_and_fail")
    return grade_with_spec(spec, log, model_patch)
