"""The grading reporter: pytest's per-test results as lines authenticated with a per-run key.

This file is copied, as ``tsl_report.py``, next to the local runner (:mod:`.runner`) and into the
container path's read-only eval directory (:mod:`..swebench.eval_run`, where pytest loads it with
``-p tsl_report``). It imports only the standard library until a :class:`Reporter` is made, so
the host imports it too, to check lines.

Line format, with ``K`` the run's key (the reporter never writes it anywhere):

    <tag> <mac_i> <KIND> <rest>      tag = "tsl-" + HMAC-SHA256(K, "tag")[:16]
                                      mac_i = HMAC-SHA256(K, f"{i}\\0{KIND}\\0{rest}")[:32]

for the i-th tagged line (i = 0, 1, ... in output order). KIND is a status (PASSED, FAILED, ERROR,
SKIPPED, XFAIL, XPASS: a non-strict expected failure that passed) with ``rest`` the node id as ``pytest -rA``
prints it, TAMPERED (``rest``: what was
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
   that make reports, or the reporter's own methods, were replaced during the run, or when an
   implementation of a report hook (``pytest_runtest_makereport``, ``pytest_report_teststatus``,
   ...) was registered or removed after collection started (a conftest.py pytest loads on the way
   aside). Code that runs before collection (imported by a conftest or a plugin) is not watched.
"""

import hashlib
import hmac
import os
import sys

__all__ = ["Reporter", "keyed_hash", "line_tag", "line_mac", "signed_lines", "make_undumpable"]

REPORT_FD_ENV = "TSL_REPORT_FD"
_PR_SET_DUMPABLE = 4
_RESTORED = (
    "PYTEST_ADDOPTS",
    "PYTHONPATH",
    "PYTHONNOUSERSITE",
)  # the container path's wrapper saves these as TSL_ORIG_*


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
# Hooks whose implementations decide or rewrite what a test's report says. One registered while the
# tests are collected or run (code under test reaching pytest's Config through `gc` and registering a
# hookwrapper of pytest_runtest_makereport that turns failures into passes), or one removed, is
# tampering; a conftest.py that pytest itself loads on the way (a subdirectory's) is not.
_REPORT_HOOKS = (
    "pytest_runtest_protocol",
    "pytest_runtest_setup",
    "pytest_runtest_call",
    "pytest_runtest_teardown",
    "pytest_runtest_makereport",
    "pytest_runtest_logreport",
    "pytest_report_teststatus",
    "pytest_pyfunc_call",
    "pytest_runtestloop",
    "pytest_make_collect_report",
    "pytest_collectreport",
    "pytest_sessionfinish",
    "pytest_report_to_serializable",
    "pytest_report_from_serializable",
)


def _hookimpls(caller) -> list:
    """A hook's implementations (pluggy >= 0.6, or the lists of the pluggy older pytests vendored)."""
    get = getattr(caller, "get_hookimpls", None)
    if get is not None:
        return list(get())
    return list(getattr(caller, "_nonwrappers", [])) + list(getattr(caller, "_wrappers", []))


def _hook_snapshot(manager) -> "dict[str, list]":
    """hook name -> [(implementation, its function)] of the report hooks, now."""
    out = {}
    for name in _REPORT_HOOKS:
        caller = getattr(manager.hook, name, None)
        if caller is not None:
            out[name] = [(impl, getattr(impl, "function", None)) for impl in _hookimpls(caller)]
    return out


def _from_conftest(manager, impl) -> bool:
    """Whether ``impl`` is a function of a conftest module pytest loaded (its code in that file)."""
    plugin = impl.plugin
    try:
        if plugin not in getattr(manager, "_conftest_plugins", ()):
            return False
    except TypeError:
        return False
    path = getattr(plugin, "__file__", None) or ""
    code = getattr(getattr(impl, "function", None), "__code__", None)
    return (
        os.path.basename(path) == "conftest.py"
        and code is not None
        and os.path.abspath(code.co_filename) == os.path.abspath(path)
    )


def _where(function) -> str:
    code = getattr(function, "__code__", None)
    if code is None:
        return repr(function)[:80]
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _hook_changes(manager, before: "dict[str, list]") -> "list[str]":
    """Report-hook implementations added (other than a loaded conftest's) or removed since ``before``."""
    out = []
    for name, old in before.items():
        caller = getattr(manager.hook, name, None)
        now = _hookimpls(caller) if caller is not None else []
        for impl in now:
            function = getattr(impl, "function", None)
            if not any(impl is a and function is f for a, f in old) and not _from_conftest(manager, impl):
                out.append(f"hook {name} added ({_where(function)})")
        for impl, function in old:
            if not any(impl is n and getattr(n, "function", None) is function for n in now):
                out.append(f"hook {name} removed ({_where(function)})")
    return out


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
                self._watched[module[len("_pytest.") :] + "." + path] = (
                    owner,
                    parts[-1],
                    vars(owner)[parts[-1]],
                )
        self._own = {name: vars(Reporter).get(name) for name in _OWN}
        self._hooks = None  # the report hooks' implementations when collection starts
        self.status = {}  # node id -> status
        self.config = None

    def pytest_sessionstart(self, session) -> None:
        self.config = session.config

    def pytest_collection(self, session) -> None:
        # Before any test module (and the code it imports) is imported: pytest's plugins, the
        # command line's and the initial conftests' are registered by now.
        try:
            self._hooks = _hook_snapshot(session.config.pluginmanager)
        except Exception:  # noqa: BLE001 - an unknown pytest/pluggy layout: the hooks are not watched
            self._hooks = None

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
        tampered = [
            name
            for name, (owner, attr, original) in self._watched.items()
            if vars(owner).get(attr) is not original
        ]
        tampered += [name for name, fn in self._own.items() if vars(Reporter).get(name) is not fn]
        if self._hooks is not None:
            try:
                tampered += _hook_changes(session.config.pluginmanager, self._hooks)
            except Exception:  # noqa: BLE001 - the hooks cannot be read back: that is tampering too
                tampered.append("report hooks unreadable")
        entries = [(status, nodeid.replace("\n", " ")) for nodeid, status in self.status.items()]
        if tampered:
            entries.append(("TAMPERED", ",".join(tampered)))
        entries.append(("END", f"{len(self.status)} {int(exitstatus)}"))
        data = ("\n" + "\n".join(signed_lines(self._key, entries)) + "\n").encode("utf-8", "replace")
        while data:
            data = data[os.write(self._out, data) :]


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
    there); undo all of that for the code under test, read the key, then add the user site back
    (its ``.pth`` lines run; ``usercustomize`` is the empty one of this directory, still first on
    ``sys.path`` then, as ``sitecustomize`` was at start-up)."""
    fd = os.environ.pop(REPORT_FD_ENV, "")
    user_site_was_on = not os.environ.get("TSL_ORIG_PYTHONNOUSERSITE") and not sys.flags.isolated
    for var in _RESTORED:
        saved = os.environ.pop("TSL_ORIG_" + var, None)
        if saved is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved
    here = os.path.dirname(os.path.abspath(__file__))
    key = ""
    if fd.isdigit():
        make_undumpable()
        try:
            key = _read_key(int(fd))
            os.close(int(fd))
        except OSError:
            key = ""
        if user_site_was_on:
            _add_user_site()
    sys.path[:] = [p for p in sys.path if not p or os.path.abspath(p) != here]
    return Reporter(key, os.dup(1)) if key else None


_reporter = _from_environment() if REPORT_FD_ENV in os.environ else None


def pytest_configure(config) -> None:
    if _reporter is not None:
        config.pluginmanager.register(_reporter, "tsl-reporter")
