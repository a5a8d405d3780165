"""The grading reporter: pytest's per-test results as lines authenticated with a per-run key.

This file is copied, as ``tsl_report.py``, next to the local runner (:mod:`.runner`) and into the
container path's read-only eval directory (:mod:`..swebench.eval_run`, where pytest loads it with
``-p tsl_report``). It imports only the standard library until a :class:`Reporter` is made, so
the host imports it too, to check lines.

Line format, with ``K`` the run's key (the reporter never writes it anywhere):

    <tag> <mac_i> <KIND> <rest>      tag = "tsl-" + HMAC-SHA256(K, "tag")[:16]
                                      mac_i = HMAC-SHA256(K, f"{i}\\0{KIND}\\0{rest}")[:32]

for the i-th tagged line (i = 0, 1, ... in output order). KIND is a status (PASSED, FAILED, ERROR,
SKIPPED, XFAIL, XPASS: a non-strict expected failure that passed) with ``rest`` the node id as ``pytest -rA`` prints it, TAMPERED (``rest``: what was
patched), and last END with ``rest`` = "<count> <exit status>". Without K no line can be made,
changed, moved or dropped unnoticed: each MAC binds its line's position, END binds the count, and
results after END are refused. So lines forged by the code under test (printed, or swapped for the
real ones by a process that reads the output pipe) never count, and the tag, which is public,
gives nothing away.

The key reaches the reporter on stdin (local runner) or a pipe (``TSL_REPORT_FD``, container path)
and is read before any test code is imported; the reporter's process is then non-dumpable
(``PR_SET_DUMPABLE`` 0), so other processes of the same uid cannot read its memory or fds through
/proc. In-process, nothing protects it: see the limit below.

This file runs inside the sandbox with whatever Python the image has: it must stay valid Python
3.6 (SWE-bench environments go back that far) and must not fail on old pytest versions (a watched
internal that does not exist is not watched).

.. warning::
   Limit: the code under test runs in the reporter's process. Code that searches the process's
   memory for the key, or patches pytest's runner or the reporter in-process, can still forge
   results. A cheap heuristic reports ``TAMPERED`` (reward 0) when any of the pytest internals
   that make reports, or the reporter's own methods, were replaced during the run.
"""

import hashlib
import hmac
import os
import sys

__all__ = ["Reporter", "keyed_hash", "line_tag", "line_mac", "signed_lines", "make_undumpable"]

REPORT_FD_ENV = "TSL_REPORT_FD"
_PR_SET_DUMPABLE = 4
_RESTORED = ("PYTEST_ADDOPTS", "PYTHONPATH", "PYTHONNOUSERSITE")  # the container path's wrapper saves these as TSL_ORIG_*


def keyed_hash(key: str, message: str) -> str:
    return hmac.new(key.encode(), message.encode("utf-8", "surrogateescape"), hashlib.sha256).hexdigest()


def line_tag(key: str) -> str:
    """The public prefix of the run's result lines (names no secret)."""
    return "tsl-" + keyed_hash(key, "tag")[:16]


def line_mac(key: str, index: int, kind: str, rest: str) -> str:
    return keyed_hash(key, f"{index}\0{kind}\0{rest}")[:32]


def signed_lines(key: str, entries: "list[tuple[str, str]]") -> "list[str]":
    """``entries`` (kind, rest) as result lines, in this order."""
    tag = line_tag(key)
    return [f"{tag} {line_mac(key, i, kind, rest)} {kind} {rest}" for i, (kind, rest) in enumerate(entries)]


def make_undumpable() -> bool:
    """``prctl(PR_SET_DUMPABLE, 0)``: /proc/<pid>/mem, fd, environ and ptrace of this process are
    closed to every other process without CAP_SYS_PTRACE (the same uid included). False where
    unsupported."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


_WATCHED = (
    ("_pytest.runner", "call_and_report"),
    ("_pytest.runner", "runtestprotocol"),
    ("_pytest.runner", "pytest_runtest_makereport"),
    ("_pytest.runner", "CallInfo.from_call"),
    ("_pytest.reports", "TestReport.from_item_and_call"),
    ("_pytest.reports", "TestReport.__init__"),
    ("_pytest.python", "pytest_pyfunc_call"),
    ("_pytest.python", "Function.runtest"),
    ("_pytest.main", "pytest_runtestloop"),
    ("_pytest.skipping", "pytest_runtest_makereport"),
)
_OWN = ("pytest_sessionstart", "pytest_collectreport", "pytest_runtest_logreport", "pytest_sessionfinish")


class Reporter:
    """A pytest plugin that records one status per test and writes the signed lines to ``out``
    (a descriptor taken before pytest captures output) when the session ends. Make it before any
    test code is imported: it snapshots the pytest internals it watches."""

    def __init__(self, key: str, out: int) -> None:
        import importlib

        self._key, self._out = key, out
        self._watched = {}
        for module, path in _WATCHED:
            parts = path.split(".")
            try:
                owner = importlib.import_module(module)
                for parent in parts[:-1]:
                    owner = getattr(owner, parent)
            except (ImportError, AttributeError):
                continue
            if parts[-1] in vars(owner):
                self._watched[module[len("_pytest."):] + "." + path] = (owner, parts[-1], vars(owner)[parts[-1]])
        self._own = {name: vars(Reporter).get(name) for name in _OWN}
        self.status = {}  # node id -> status
        self.config = None

    def pytest_sessionstart(self, session) -> None:
        self.config = session.config

    def _nodeid(self, nodeid: str) -> str:
        # As `pytest -rA` prints it (relative to the invocation directory): what swebench expects.
        config = self.config
        return config.cwd_relative_nodeid(nodeid) if config is not None and nodeid else nodeid

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self.status[self._nodeid(report.nodeid) or "<collection>"] = "ERROR"

    def pytest_runtest_logreport(self, report) -> None:
        xfail = hasattr(report, "wasxfail")
        nodeid = self._nodeid(report.nodeid)
        if report.when == "call":
            if report.passed:
                status = "XPASS" if xfail else "PASSED"
            elif report.skipped:
                status = "XFAIL" if xfail else "SKIPPED"
            else:
                status = "FAILED"
            self.status[nodeid] = status
        elif report.failed:
            self.status[nodeid] = "ERROR"
        elif report.skipped and report.when == "setup":
            self.status[nodeid] = "XFAIL" if xfail else "SKIPPED"

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        tampered = [name for name, (owner, attr, original) in self._watched.items()
                    if vars(owner).get(attr) is not original]
        tampered += [name for name, fn in self._own.items() if vars(Reporter).get(name) is not fn]
        entries = [(status, nodeid.replace("\n", " ")) for nodeid, status in self.status.items()]
        if tampered:
            entries.append(("TAMPERED", ",".join(tampered)))
        entries.append(("END", f"{len(self.status)} {int(exitstatus)}"))
        data = ("\n" + "\n".join(signed_lines(self._key, entries)) + "\n").encode("utf-8", "replace")
        while data:
            data = data[os.write(self._out, data):]


def _read_key(fd: int) -> str:
    data = b""
    while b"\n" not in data and len(data) < 256:
        chunk = os.read(fd, 256)
        if not chunk:
            break
        data += chunk
    return data.split(b"\n", 1)[0].strip().decode("ascii", "replace")


def _add_user_site() -> None:
    """Put the user site directory where start-up would have (before the first system
    site-packages entry), with its ``.pth`` files and ``usercustomize``: what the code under test
    may have planted there runs now, after the key is gone, as the tests themselves do."""
    import site

    user = site.getusersitepackages()
    site.ENABLE_USER_SITE = True
    if not user or not os.path.isdir(user):
        return
    before = list(sys.path)
    site.addsitedir(user)
    new = [p for p in sys.path if p not in before]
    rest = [p for p in sys.path if p in before]
    system = set(site.getsitepackages()) if hasattr(site, "getsitepackages") else set()
    at = next((i for i, p in enumerate(rest) if p in system), len(rest))
    sys.path[:] = rest[:at] + new + rest[at:]
    if hasattr(site, "execusercustomize"):
        site.execusercustomize()


def _from_environment() -> "Reporter | None":
    """The container path: the wrapper exported ``TSL_REPORT_FD`` (a pipe holding the key), put
    this directory on PYTHONPATH and ``-p tsl_report`` in PYTEST_ADDOPTS and turned the user site
    off (``PYTHONNOUSERSITE``: an install step run by the script may have planted start-up code
    there); undo all of that for the code under test, read the key, then add the user site back."""
    fd = os.environ.pop(REPORT_FD_ENV, "")
    user_site_was_on = not os.environ.get("TSL_ORIG_PYTHONNOUSERSITE") and not sys.flags.isolated
    for var in _RESTORED:
        saved = os.environ.pop("TSL_ORIG_" + var, None)
        if saved is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path[:] = [p for p in sys.path if not p or os.path.abspath(p) != here]
    if not fd.isdigit():
        return None
    make_undumpable()
    try:
        key = _read_key(int(fd))
        os.close(int(fd))
    except OSError:
        key = ""
    if user_site_was_on:
        _add_user_site()
    return Reporter(key, os.dup(1)) if key else None


_reporter = _from_environment() if REPORT_FD_ENV in os.environ else None


def pytest_configure(config) -> None:
    if _reporter is not None:
        config.pluginmanager.register(_reporter, "tsl-reporter")
