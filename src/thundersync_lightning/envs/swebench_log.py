"""Host framing of a SWE-bench eval script's log, so lines printed by the code under test cannot
act as swebench's markers.

swebench grades the text between ``>>>>> Start Test Output`` and ``>>>>> End Test Output`` and
trusts the first ``>>>>> Test Exit Code: N`` it finds; the code under test can print all of them
(from an atexit hook, say). Here the eval script's own markers are rewritten to carry a random
per-run nonce (:func:`frame_eval_script`); in the output, every line that mentions a swebench
marker without the nonce is dropped and the nonce-carrying ones become the real markers again
(:func:`reframe_log`). For pytest-style parsers a test reported with two different statuses (a
forged ``PASSED`` line next to the real ``FAILED`` one) counts as failed (:func:`contradicted`).

.. warning::
   Limit: the instance's eval script runs inside the container as the same uid as the tests, so
   code under test that reads the script (``/proc``, the script file) learns the nonce, and a
   forged status line for a test that never reported itself cannot be told from a real one.
   The local-task runner (:mod:`.code.runner`) closes these; the container path does not.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["frame_eval_script", "reframe_log", "contradicted"]


def _markers() -> tuple[str, ...]:
    from swebench.harness.constants import (
        APPLY_PATCH_FAIL,
        APPLY_PATCH_PASS,
        END_TEST_OUTPUT,
        RESET_FAILED,
        START_TEST_OUTPUT,
        TEST_EXIT_CODE,
        TESTS_ERROR,
        TESTS_TIMEOUT,
    )

    return (START_TEST_OUTPUT, END_TEST_OUTPUT, TEST_EXIT_CODE, APPLY_PATCH_FAIL, APPLY_PATCH_PASS, RESET_FAILED,
            TESTS_ERROR, TESTS_TIMEOUT)


def _tag(marker: str, nonce: str) -> str:
    return f"{nonce}:{marker.strip('> ').replace(' ', '_')}"


def frame_eval_script(script: str, nonce: str) -> str:
    """``script`` with swebench's start/end/exit-code markers replaced by nonce-carrying tags."""
    from swebench.harness.constants import END_TEST_OUTPUT, START_TEST_OUTPUT, TEST_EXIT_CODE

    for marker in (START_TEST_OUTPUT, END_TEST_OUTPUT, TEST_EXIT_CODE):
        script = script.replace(marker, _tag(marker, nonce))
    return script


def reframe_log(output: str, nonce: str) -> str:
    """The run's output with forged markers removed and the script's own restored."""
    markers = _markers()
    tags = {_tag(m, nonce): m for m in markers}
    out = []
    for line in output.split("\n"):
        if nonce in line:
            for tag, marker in tags.items():
                line = line.replace(tag, marker)
            out.append(line)
        elif not any(m in line for m in markers):
            out.append(line)
    return "\n".join(out)


def contradicted(log: str, parse_line: Callable[[str], dict[str, str]]) -> set[str]:
    """Tests that ``parse_line`` (a line-based parser applied to each line alone) sees with more
    than one status in ``log``."""
    seen: dict[str, set[str]] = {}
    for line in log.split("\n"):
        for test, status in parse_line(line).items():
            seen.setdefault(test, set()).add(status)
    return {t for t, statuses in seen.items() if len(statuses) > 1}
