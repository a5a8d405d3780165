"""Patch hygiene and grading through swebench's own log parser and FAIL_TO_PASS/PASS_TO_PASS report.

Reward-hacking guards live here: :func:`filter_patch` drops every file diff that touches a
protected path (tests, conftest.py, pytest configuration, caches) so such changes are reverted
before grading, and an empty remaining patch is reward 0 without running anything.
The test log is framed by the host (markers and the test command's exit status come from the
sandbox result, not from the sandboxed output), then graded by ``swebench.harness.grading``.
"""

from __future__ import annotations

import os
import re
import shlex
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..sandbox.base import SandboxResult

__all__ = ["EvalOutcome", "split_patch", "filter_patch", "pytest_command", "framed_log", "grade_log",
           "grade_with_spec"]

_DIFF_HEADER = re.compile(r"^diff --git (?:\"?a/(.+?)\"?) (?:\"?b/(.+?)\"?)$")


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


def split_patch(patch: str) -> list[tuple[tuple[str, ...], str]]:
    """Split a ``git diff`` into ((paths touched), text) per file; text before the first header is
    dropped. Paths come from the ``diff --git`` line and any ---/+++/rename/copy lines."""
    out: list[tuple[tuple[str, ...], str]] = []
    current: list[str] | None = None
    paths: set[str] = set()
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            if current is not None:
                out.append((tuple(sorted(paths)), "".join(current)))
            current, paths = [line], set()
            m = _DIFF_HEADER.match(line.rstrip("\n"))
            if m:
                paths.update(m.groups())
            else:
                paths.add(line[len("diff --git "):].strip())
            continue
        if current is None:
            continue
        current.append(line)
        for prefix in ("--- a/", "+++ b/", "rename from ", "rename to ", "copy from ", "copy to "):
            if line.startswith(prefix):
                paths.add(line[len(prefix):].rstrip("\n").strip('"'))
    if current is not None:
        out.append((tuple(sorted(paths)), "".join(current)))
    return out


def filter_patch(patch: str, protected: Callable[[str], bool]) -> str:
    """The patch without file diffs that touch any protected path."""
    return "".join(text for paths, text in split_patch(patch) if not any(protected(p) for p in paths))


def pytest_command(node_ids: Sequence[str], python: str = "python3") -> str:
    files = list(dict.fromkeys(n.split("::", 1)[0] for n in node_ids))
    return (f"{python} -m pytest -rA --tb=short -p no:cacheprovider -o addopts='' "
            + " ".join(shlex.quote(f) for f in files))


def framed_log(result: SandboxResult) -> str:
    """The test output between swebench's markers, with the exit status the host observed."""
    from swebench.harness.constants import (
        END_TEST_OUTPUT,
        START_TEST_OUTPUT,
        TEST_EXIT_CODE,
        TESTS_ERROR,
        TESTS_TIMEOUT,
    )

    code = "-1" if result.exit_code is None else str(result.exit_code)
    # A run we stopped (deadline, output cap) has no trustworthy results: swebench's markers say so.
    note = f"\n{TESTS_TIMEOUT}\n" if result.timed_out else f"\n{TESTS_ERROR}\n" if result.truncated else ""
    return f"{START_TEST_OUTPUT}\n{result.text}\n{END_TEST_OUTPUT}\n{TEST_EXIT_CODE}: {code}\n{note}"


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
