"""The grading test run of local tasks: a host-written pytest runner and an unforgeable result channel.

Isolation: the runner (a script and a ``pytest.ini`` the host writes to a read-only directory
outside the work tree) runs as ``python3 -I`` (no cwd or script directory on ``sys.path``, no
``PYTHON*`` variables, no user site), imports pytest before the repository is put on the path
(``pythonpath`` in the host's ini), with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, ``-c`` the host's
ini, ``--rootdir`` and ``--confcutdir`` fixed and ``-p no:cacheprovider``. A ``pytest.py``,
``*.dist-info`` entry point, ``pytest.ini``/``setup.cfg``/``tox.ini`` in the work tree is
therefore never loaded.

Results: the host sends a random per-run key on stdin; the runner makes its process non-dumpable
and reads the key before any test code is imported, and the reporter (:mod:`.reporter`, copied
next to the runner as ``tsl_report.py``) writes one line per test, then an end line with the count
and pytest's exit status, each authenticated with the key (HMAC; the key itself is never
written). Only lines that verify count: output printed by the code under test (``PASSED ...``
lines, swebench's ``>>>>>`` markers, from an atexit hook or anywhere else), or result lines
altered, reordered or cut short, never do; a run without the end line (killed, ``os._exit``) has no
results. The log handed to swebench's parser and report is rebuilt from the verified lines,
framed by the host with the exit status the host observed.

.. warning::
   Limit: the code under test runs in the runner's process (see :mod:`.reporter`): code that
   searches the process's memory for the key, or patches pytest's runner or the reporter
   in-process, can still forge results; the plain form of the patching is reported as
   ``TAMPERED`` (reward 0).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from . import reporter
from .reporter import line_mac, line_tag

__all__ = [
    "RUNNER_DIR",
    "write_runner",
    "write_host_dir",
    "runner_command",
    "new_key",
    "parse_results",
    "RunnerResults",
    "reporter_source",
    "check_exit",
]

RUNNER_DIR = "/tsl-runner"  # bound read-only inside the sandbox

_RUNNER = r"""
import os
import sys


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, here)  # only the host's files: tsl_report.py
    import tsl_report

    sys.path.remove(here)
    tsl_report.make_undumpable()  # before the key is in memory
    key = sys.stdin.buffer.readline().strip().decode("ascii", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    import pytest

    reporter = tsl_report.Reporter(key, os.dup(1))
    sys.exit(int(pytest.main(sys.argv[1:], plugins=[reporter])))


main()
"""

_INI = """[pytest]
pythonpath = {workdir}
addopts =
python_files = test_*.py *_test.py
"""


def reporter_source() -> str:
    """The text of :mod:`.reporter` (installed in sandboxes as ``tsl_report.py``)."""
    return Path(reporter.__file__).read_text(encoding="utf-8")


def write_host_dir(directory: str, files: Sequence[tuple[str, str]]) -> None:
    """Write ``files`` (name, text) into ``directory``, owned by the host and read-only to others."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    for name, text in files:
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, 0o644)
    os.chmod(directory, 0o755)


def write_runner(directory: str, workdir: str = "/testbed") -> None:
    """Write the runner script, its reporter and its pytest.ini into the (host-owned) ``directory``."""
    write_host_dir(
        directory,
        [
            ("run_tests.py", _RUNNER),
            ("tsl_report.py", reporter_source()),
            ("pytest.ini", _INI.format(workdir=workdir)),
        ],
    )


def runner_command(node_ids: Sequence[str], python: str = "python3", workdir: str = "/testbed") -> str:
    """The sandbox command running ``node_ids``' files through the host's runner."""
    files = list(dict.fromkeys(n.split("::", 1)[0] for n in node_ids))
    args = [
        python,
        "-I",
        f"{RUNNER_DIR}/run_tests.py",
        "-c",
        f"{RUNNER_DIR}/pytest.ini",
        f"--rootdir={workdir}",
        f"--confcutdir={workdir}",
        "-p",
        "no:cacheprovider",
        "-q",
        "--tb=short",
        "--",
        *files,
    ]
    return "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 exec " + " ".join(shlex.quote(a) for a in args)


def new_key() -> str:
    """A fresh per-run key (sent to the reporter on stdin; never printed)."""
    return secrets.token_hex(32)


@dataclass(frozen=True, slots=True)
class RunnerResults:
    """What the reporter said: (status, nodeid) lines, its exit status, and why it is not to be
    trusted (``problem``; None when it is)."""

    lines: tuple[tuple[str, str], ...]
    exit_status: int | None
    problem: str | None

    def log_body(self, skipped: bool = True) -> str:
        """The results as pytest ``-rA`` summary lines (what swebench's pytest parser reads), an
        unexpected pass (XPASS, a status swebench does not know) as FAILED; ``skipped=False`` leaves
        out SKIPPED tests, which ``-rA`` prints in a form the parser ignores."""
        return "".join(
            f"{'FAILED' if status == 'XPASS' else status} {nodeid}\n"
            for status, nodeid in self.lines
            if skipped or status != "SKIPPED"
        )


_FAILING = frozenset({"FAILED", "ERROR"})


def check_exit(results: RunnerResults, observed: int | None) -> RunnerResults:
    """Cross-check the reporter's results against what the host saw outside the process under test.

    The runner exits with pytest's exit status, so ``observed`` must equal the reporter's; and
    pytest's own count of failures (which decides between exit status 0 and 1) must agree with
    the statuses the reporter recorded: exit status 0 with a FAILED or ERROR result, or 1 with
    none, means the reporter's record was changed in-process (e.g. its status table replaced by
    the code under test). ``results`` with ``problem`` set when they disagree.
    """
    if results.problem is not None:
        return results
    status = results.exit_status
    failing = any(s in _FAILING for s, _ in results.lines)
    problem = None
    if observed is not None and status != observed:
        problem = f"the reporter says exit status {status}, the runner exited with {observed}"
    elif (status == 0 and failing) or (status == 1 and not failing):
        problem = (
            f"exit status {status} disagrees with the reported outcomes "
            f"({'some' if failing else 'no'} test failed or errored)"
        )
    return results if problem is None else replace(results, problem=problem)


def parse_results(output: str, key: str) -> RunnerResults:
    """Read the reporter's lines (those carrying the run's tag) from ``output`` and verify each
    against ``key``; every other line is ignored. Any tagged line that fails verification, or
    comes after the end line, voids the results."""
    lines: list[tuple[str, str]] = []
    end: tuple[int, int] | None = None
    tampered = None
    pattern = re.compile(rf"^{re.escape(line_tag(key))} ([0-9a-f]{{32}}) (\S+) ?(.*)$")
    index = 0
    for raw in output.split("\n"):
        m = pattern.match(raw)
        if m is None:
            continue
        mac, kind, rest = m.group(1), m.group(2), m.group(3)
        if end is not None:
            return RunnerResults((), None, "results after the reporter's end line")
        if not secrets.compare_digest(mac, line_mac(key, index, kind, rest)):
            return RunnerResults(
                (), None, f"result line {index} fails authentication (forged, altered or moved)"
            )
        index += 1
        if kind == "END":
            count, _, status = rest.partition(" ")
            try:
                end = (int(count), int(status))
            except ValueError:
                return RunnerResults((), None, "malformed end line")
        elif kind == "TAMPERED":
            tampered = rest
        else:
            lines.append((kind, rest))
    if end is None:
        return RunnerResults((), None, "the test run ended before the reporter wrote its results")
    if end[0] != len(lines):
        return RunnerResults((), None, f"the reporter announced {end[0]} results, {len(lines)} arrived")
    if tampered:
        return RunnerResults(
            tuple(lines), end[1], f"pytest internals were patched during the run: {tampered}"
        )
    return RunnerResults(tuple(lines), end[1], None)
