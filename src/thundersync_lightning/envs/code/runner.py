"""The grading test run of local tasks: a host-written pytest runner and an unforgeable result channel.

Isolation: the runner (a script and a ``pytest.ini`` the host writes to a read-only directory
outside the work tree) runs as ``python3 -I`` (no cwd or script directory on ``sys.path``, no
``PYTHON*`` variables, no user site), imports pytest before the repository is put on the path
(``pythonpath`` in the host's ini), with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1``, ``-c`` the host's
ini, ``--rootdir`` and ``--confcutdir`` fixed and ``-p no:cacheprovider``. A ``pytest.py``,
``*.dist-info`` entry point, ``pytest.ini``/``setup.cfg``/``tox.ini`` in the work tree is
therefore never loaded.

Results: the host sends a random per-run nonce on stdin; the runner reads it before any test code
is imported, and a reporter plugin writes one ``<nonce> STATUS nodeid`` line per test, then
``<nonce> END <count> <exit status>``, when the session ends. Only those lines count: output
printed by the code under test (``PASSED ...`` lines, swebench's ``>>>>>`` markers, from an atexit
hook or anywhere else) lacks the nonce and is ignored; a run without the trailer (killed,
``os._exit``) has no results. The log handed to swebench's parser and report is rebuilt from the
nonce lines, framed by the host with the exit status the host observed.

.. warning::
   Limit: the code under test runs in the runner's process. Code that searches the process's
   memory for the nonce, or patches pytest's runner or the reporter in-process, can still forge
   results. A cheap detection heuristic reports ``TAMPERED`` (reward 0) when any of the pytest
   internals that make reports, or the reporter's own methods, were replaced during the run.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RUNNER_DIR", "write_runner", "runner_command", "new_nonce", "parse_results", "RunnerResults"]

RUNNER_DIR = "/tsl-runner"  # bound read-only inside the sandbox

_RUNNER = r'''
import os
import sys


def main():
    nonce = sys.stdin.buffer.readline().strip().decode("ascii", "replace")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    out = os.dup(1)
    write = os.write
    import pytest
    import _pytest.main
    import _pytest.python
    import _pytest.reports
    import _pytest.runner
    import _pytest.skipping

    watched = {
        "runner.call_and_report": (_pytest.runner, "call_and_report"),
        "runner.runtestprotocol": (_pytest.runner, "runtestprotocol"),
        "runner.pytest_runtest_makereport": (_pytest.runner, "pytest_runtest_makereport"),
        "runner.CallInfo.from_call": (_pytest.runner.CallInfo, "from_call"),
        "reports.TestReport.from_item_and_call": (_pytest.reports.TestReport, "from_item_and_call"),
        "reports.TestReport.__init__": (_pytest.reports.TestReport, "__init__"),
        "python.pytest_pyfunc_call": (_pytest.python, "pytest_pyfunc_call"),
        "python.Function.runtest": (_pytest.python.Function, "runtest"),
        "main.pytest_runtestloop": (_pytest.main, "pytest_runtestloop"),
        "skipping.pytest_runtest_makereport": (_pytest.skipping, "pytest_runtest_makereport"),
    }

    class Reporter:
        def __init__(self):
            self.status = {}

        def pytest_collectreport(self, report):
            if report.failed:
                self.status[report.nodeid or "<collection>"] = "ERROR"

        def pytest_runtest_logreport(self, report):
            xfail = hasattr(report, "wasxfail")
            if report.when == "call":
                if report.passed:
                    status = "FAILED" if xfail else "PASSED"
                elif report.skipped:
                    status = "XFAIL" if xfail else "SKIPPED"
                else:
                    status = "FAILED"
                self.status[report.nodeid] = status
            elif report.failed:
                self.status[report.nodeid] = "ERROR"
            elif report.skipped and report.when == "setup":
                self.status[report.nodeid] = "XFAIL" if xfail else "SKIPPED"

        def pytest_sessionfinish(self, session, exitstatus):
            tampered = [name for name, (owner, attr) in watched.items()
                        if vars(owner).get(attr) is not originals[name]]
            tampered += [name for name, fn in own.items() if vars(Reporter).get(name) is not fn]
            lines = [nonce + " " + status + " " + nodeid.replace("\n", " ")
                     for nodeid, status in self.status.items()]
            if tampered:
                lines.append(nonce + " TAMPERED " + ",".join(tampered))
            lines.append(nonce + " END " + str(len(self.status)) + " " + str(int(exitstatus)))
            data = ("\n" + "\n".join(lines) + "\n").encode("utf-8", "replace")
            while data:
                data = data[write(out, data):]

    originals = {name: vars(owner).get(attr) for name, (owner, attr) in watched.items()}
    own = {name: vars(Reporter).get(name) for name in
           ("pytest_collectreport", "pytest_runtest_logreport", "pytest_sessionfinish")}
    sys.exit(int(pytest.main(sys.argv[1:], plugins=[Reporter()])))


main()
'''

_INI = """[pytest]
pythonpath = {workdir}
addopts =
python_files = test_*.py *_test.py
"""


def write_runner(directory: str, workdir: str = "/testbed") -> None:
    """Write the runner script and its pytest.ini into the (host-owned) ``directory``."""
    os.makedirs(directory, mode=0o755, exist_ok=True)
    for name, text in (("run_tests.py", _RUNNER), ("pytest.ini", _INI.format(workdir=workdir))):
        path = os.path.join(directory, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(path, 0o644)
    os.chmod(directory, 0o755)


def runner_command(node_ids: Sequence[str], python: str = "python3", workdir: str = "/testbed") -> str:
    """The sandbox command running ``node_ids``' files through the host's runner."""
    files = list(dict.fromkeys(n.split("::", 1)[0] for n in node_ids))
    args = [python, "-I", f"{RUNNER_DIR}/run_tests.py", "-c", f"{RUNNER_DIR}/pytest.ini", f"--rootdir={workdir}",
            f"--confcutdir={workdir}", "-p", "no:cacheprovider", "-q", "--tb=short", "--", *files]
    return "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 exec " + " ".join(shlex.quote(a) for a in args)


def new_nonce() -> str:
    return "tsl-" + secrets.token_hex(16)


@dataclass(frozen=True, slots=True)
class RunnerResults:
    """What the reporter said: (status, nodeid) lines, its exit status, and why it is not to be
    trusted (``problem``; None when it is)."""

    lines: tuple[tuple[str, str], ...]
    exit_status: int | None
    problem: str | None

    def log_body(self) -> str:
        """The results as pytest ``-rA`` summary lines (what swebench's pytest parser reads)."""
        return "".join(f"{status} {nodeid}\n" for status, nodeid in self.lines)


def parse_results(output: str, nonce: str) -> RunnerResults:
    """Read the nonce-framed lines from the runner's output; every other line is ignored."""
    lines: list[tuple[str, str]] = []
    end: tuple[int, int] | None = None
    tampered = None
    pattern = re.compile(rf"^{re.escape(nonce)} (\S+) ?(.*)$")
    for raw in output.split("\n"):
        m = pattern.match(raw)
        if m is None:
            continue
        kind, rest = m.group(1), m.group(2)
        if end is not None:
            return RunnerResults((), None, "results after the reporter's end line")
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
        return RunnerResults(tuple(lines), end[1], f"pytest internals were patched during the run: {tampered}")
    return RunnerResults(tuple(lines), end[1], None)
