"""The container path's eval run: the instance's eval script, run so that the code under test can
neither read the run's secret nor forge what decides the grade.

swebench grades the text between ``>>>>> Start Test Output`` and ``>>>>> End Test Output`` and
trusts the first ``>>>>> Test Exit Code: N`` it finds; the code under test can print all of them,
and any ``PASSED <test>`` line (from an atexit hook, before an ``os._exit``). Here:

- **The script holds no secret and is not writable.** The host writes the framed script
  (:func:`frame_eval_script`) and the reporter (:mod:`.code.reporter`, as ``tsl_report_<random>.py``) to a
  root-owned directory bound read-only at ``/tsl-eval``; the container runs
  :func:`eval_command`, which reads the run's secrets from stdin into unexported variables of the
  container's first shell, points stdin at /dev/null, and sources the script. The secrets are in
  no file, argument or environment variable.
- **The shell that holds them cannot be read by the tests' uid.** That shell is the image's own
  shell binary, copied by the host into ``/tsl-eval`` as root with mode 0711 (execute only). The
  kernel marks a process that executes a file it may not read as not dumpable (``would_dump``
  at exec; the same holds for its forks, e.g. the process substitution that feeds the key to the
  reporter), so the code under test, same uid but no ``CAP_SYS_PTRACE``, can neither ptrace it
  nor open its ``/proc/<pid>/mem``, ``environ`` or ``fd``, whatever ``kernel.yama.ptrace_scope``
  says. Only a host with ``fs.suid_dumpable=1`` undoes that (a warning names it).
- **Markers carry per-marker tags.** The script's marker lines become calls that print a tag
  (HMAC of the key, one per marker); in the output (:func:`reframe_log`) every line mentioning a
  swebench marker without the right tag is dropped and the tags become the real markers again.
- **Nothing from before survives into the tests, nothing from the tests into the end.** Right
  before the start tag and right before the end tag the shell SIGKILLs every other process of
  the container (``kill -1``): a daemon left by agent code run earlier in the script (a package
  build) cannot watch the test run, and one left by the tests cannot read or replace the end
  marker or exit code as they pass through the output pipe.
- **For pytest log parsers, results come from the reporter, not from the log.** The test command
  runs with ``-p tsl_report_<random>`` (``PYTEST_ADDOPTS``; restored, with ``PYTHONPATH``, before any test
  code runs) and the key on a pipe it drains at import, before conftest or test code is imported;
  the log swebench grades is rebuilt from the lines that verify (:func:`.code.runner.parse_results`)
  and framed by the host with the reporter's exit status. A run without them grades 0. For other
  parsers the log is graded as printed, so a status line forged by the code under test still counts
  (a documented limit).
- **The graded run's pytest configuration is the instance's own.** Right before the start tag,
  with every other process killed, the shell prints a manifest of the files pytest reads its
  configuration and plugins from (:mod:`.code.pytest_config`), each line tagged; the host compares
  it with the original tree's (``config=``) and a difference (``setup.py`` rewrote ``setup.cfg``,
  wrote a ``.pytest.ini`` with ``addopts = -p <module>``, declared a ``pytest11`` entry point)
  voids the run, the changed paths in the reason.
- **Nothing the script's install step wrote runs before the reporter.** The script's
  ``pip install -e .`` runs the agent's ``setup.py``; the image is read-only, so what it can plant
  lies under ``/testbed`` or ``$HOME`` (``/tmp``), and of those only the user site directory
  (``~/.local/lib/pythonX.Y/site-packages``: ``*.pth`` import lines, ``usercustomize``) runs at
  interpreter start-up. The test command therefore starts with ``PYTHONNOUSERSITE=1``; the
  reporter adds the user site back, at its usual place on ``sys.path``, only after it has drained
  and closed the key pipe, so an install that fell back to the user site still counts.

.. warning::
   Limits: the container's first shell and the test process run as the same uid as the code under
   test; both are non-dumpable (the shell by its execute-only binary, the reporter by ``prctl``),
   except where ``fs.suid_dumpable`` is 1 (a warning names such a host). The in-process limit of
   :mod:`.code.reporter` applies as well.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from secrets import token_hex
from typing import Any

from ..repo.grading import EvalOutcome, framed_log, grade_with_spec
from ..repo.pytest_config import config_changes, manifest_command, parse_manifest
from ..repo.reporter import REPORT_FD_ENV, keyed_hash
from ..repo.runner import check_exit, new_key, parse_results, reporter_source, write_host_dir
from ..sandbox.base import SandboxResult

__all__ = [
    "EVAL_DIR",
    "EvalSecrets",
    "frame_eval_script",
    "eval_command",
    "write_eval_dir",
    "reframe_log",
    "uses_reporter",
    "grade_eval_run",
    "warn_if_dumpable",
    "SHELL_NAME",
    "eval_files",
    "FRESH_BYTECODE",
    "STARTUP_FILES",
]

log = logging.getLogger(__name__)

EVAL_DIR = "/tsl-eval"  # bound read-only inside the container
_KEY_FD = 197  # the reporter's key pipe (high: eval scripts use low descriptors)
_warned_dumpable = False


@dataclass(frozen=True, slots=True)
class EvalSecrets:
    """The run's key (for the reporter) and the marker tags derived from it."""

    key: str

    @classmethod
    def new(cls) -> EvalSecrets:
        return cls(new_key())

    def tag(self, marker: str) -> str:
        return "tsl-" + keyed_hash(self.key, "marker\0" + marker)[:24]

    def stdin(self) -> bytes:
        """What :func:`eval_command` reads: the key, the three marker tags and the configuration
        manifest's tag, one line."""
        start, end, code = _markers()[:3]
        return f"{self.key} {self.tag(start)} {self.tag(end)} {self.tag(code)} {self.config_tag}\n".encode()

    @property
    def config_tag(self) -> str:
        """The tag of the eval shell's configuration manifest lines (see :mod:`.code.pytest_config`)."""
        return self.tag("pytest configuration")

    def config_manifest(self, output: str) -> dict[str, str] | None:
        """The manifest the eval shell printed before the tests (None: it printed none, or no end)."""
        prefix = self.config_tag + " "
        lines = [line[len(prefix) :] for line in output.split("\n") if line.startswith(prefix)]
        if not lines or lines[-1] != "end":
            return None
        return parse_manifest("\n".join(lines[:-1]))


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

    return (
        START_TEST_OUTPUT,
        END_TEST_OUTPUT,
        TEST_EXIT_CODE,
        APPLY_PATCH_FAIL,
        APPLY_PATCH_PASS,
        RESET_FAILED,
        TESTS_ERROR,
        TESTS_TIMEOUT,
    )


# The first shell's prelude. xtrace is off inside the helpers (their expansions would print the key);
# `kill -1` reaches every process of the container but this shell and pid 1.
_PRELUDE = r"""IFS=' ' read -r __tsl_key __tsl_start __tsl_end __tsl_exit __tsl_config || exit 97
exec 0</dev/null
__tsl_test_start() {
  { __tsl_flags=$-; set +x; } 2>/dev/null
  kill -s KILL -- -1 2>/dev/null
  @FRESH_BYTECODE@
  { @MANIFEST@; } | while IFS= read -r __tsl_line; do printf '%s %s\n' "$__tsl_config" "$__tsl_line"; done
  printf '%s end\n' "$__tsl_config"
  printf '%s\n' "$__tsl_start"
  if [ -n "${1-}" ]; then
    [ -n "${PYTEST_ADDOPTS+x}" ] && export TSL_ORIG_PYTEST_ADDOPTS="$PYTEST_ADDOPTS"
    [ -n "${PYTHONPATH+x}" ] && export TSL_ORIG_PYTHONPATH="$PYTHONPATH"
    [ -n "${PYTHONNOUSERSITE+x}" ] && export TSL_ORIG_PYTHONNOUSERSITE="$PYTHONNOUSERSITE"
    export PYTHONNOUSERSITE=1
    export PYTEST_ADDOPTS="-p $1${PYTEST_ADDOPTS:+ $PYTEST_ADDOPTS}"
    export PYTHONPATH="@EVAL_DIR@${PYTHONPATH:+:$PYTHONPATH}"
    export @FD_ENV@=@FD@
    exec @FD@< <(printf '%s\n' "$__tsl_key")
  fi
  case $__tsl_flags in *x*) set -x;; esac
}
__tsl_test_end() {
  { __tsl_flags=$-; set +x; } 2>/dev/null
  kill -s KILL -- -1 2>/dev/null
  if [ -n "${__tsl_pycache_was+x}" ]; then export PYTHONPYCACHEPREFIX="$__tsl_pycache_was"
  else unset PYTHONPYCACHEPREFIX; fi
  if [ -n "${@FD_ENV@+x}" ]; then
    exec @FD@<&-
    unset @FD_ENV@
    if [ -n "${TSL_ORIG_PYTEST_ADDOPTS+x}" ]; then export PYTEST_ADDOPTS="$TSL_ORIG_PYTEST_ADDOPTS"
    else unset PYTEST_ADDOPTS; fi
    if [ -n "${TSL_ORIG_PYTHONPATH+x}" ]; then export PYTHONPATH="$TSL_ORIG_PYTHONPATH"
    else unset PYTHONPATH; fi
    if [ -n "${TSL_ORIG_PYTHONNOUSERSITE+x}" ]; then export PYTHONNOUSERSITE="$TSL_ORIG_PYTHONNOUSERSITE"
    else unset PYTHONNOUSERSITE; fi
    unset TSL_ORIG_PYTEST_ADDOPTS TSL_ORIG_PYTHONPATH TSL_ORIG_PYTHONNOUSERSITE
  fi
  printf '%s\n' "$__tsl_end"
  case $__tsl_flags in *x*) set -x;; esac
}
. @EVAL_DIR@/eval.sh
"""


SHELL_NAME = "tsl-bash"  # the execute-only copy of the image's bash in EVAL_DIR (not "sh": POSIX mode)
# Right after `kill -1` (nothing the install step started is alive): no bytecode written before the
# tests is read by them. Old pytest versions ignore PYTHONPYCACHEPREFIX for their assertion-rewrite
# cache (next to the source), so the tree's __pycache__ directories go as well.
FRESH_BYTECODE = (
    '[ -n "${PYTHONPYCACHEPREFIX+x}" ] && __tsl_pycache_was="$PYTHONPYCACHEPREFIX"; '
    "{ find /testbed -path /testbed/.git -prune -o -type d -name __pycache__ -prune -exec rm -rf -- {} +; } "
    "2>/dev/null || :; "
    'export PYTHONPYCACHEPREFIX="$(mktemp -d /tmp/tsl-pycache-XXXXXXXXXX 2>/dev/null || echo /nonexistent)"'
)
#: The eval directory's start-up modules, first on the test command's ``sys.path`` (``PYTHONPATH``):
#: the work tree's (a module, a package, whatever the install step wrote) never run at start-up.
STARTUP_FILES = (
    ("sitecustomize.py", "# thundersync: the host's, found first: no other runs at start-up\n"),
    ("usercustomize.py", "# thundersync: the host's, found first: no other runs at start-up\n"),
)


def eval_command() -> str:
    """The container's command: become the execute-only shell (:data:`SHELL_NAME`), which reads the
    secrets from stdin, then sources ``/tsl-eval/eval.sh``."""
    prelude = (
        _PRELUDE.replace("@EVAL_DIR@", EVAL_DIR)
        .replace("@FD_ENV@", REPORT_FD_ENV)
        .replace("@FD@", str(_KEY_FD))
        .replace("@MANIFEST@", manifest_command())
        .replace("@FRESH_BYTECODE@", FRESH_BYTECODE)
    )
    return f"exec {EVAL_DIR}/{SHELL_NAME} -c {shlex.quote(prelude)}"


def uses_reporter(log_parser: str) -> bool:
    """Whether the instance's results are read from the reporter (pytest-style log parsers)."""
    return log_parser.startswith("parse_log_pytest")


def frame_eval_script(script: str, plugin: str | None) -> str:
    """``script`` with its start/end marker lines replaced by the prelude's helpers and its exit
    code marker by the exit tag; ``plugin``: the reporter's module name, loaded by the test command
    (None: no reporter). A marker in any other form is left as it is (and then dropped from the
    output by :func:`reframe_log`: the run has no results)."""
    start, end, code = _markers()[:3]
    out = []
    for line in script.split("\n"):
        if line.strip() == f": '{start}'":
            line = "__tsl_test_start" + (f" {plugin}" if plugin else "")
        elif line.strip() == f": '{end}'":
            line = "__tsl_test_end"
        else:
            line = line.replace(code, "${__tsl_exit}")
        out.append(line)
    return "\n".join(out)


def eval_files(script: str, log_parser: str) -> list[tuple[str, str]]:
    """The eval directory's text files (name, text): the instance's eval ``script``, framed, and (for
    pytest log parsers) the reporter. The reporter's module name is random per run: a file of that
    name in the work tree (first on ``sys.path`` under ``python -m pytest``) cannot be prepared to
    stand in for it."""
    plugin = f"tsl_report_{token_hex(8)}" if uses_reporter(log_parser) else None
    files = [("eval.sh", frame_eval_script(script, plugin)), *STARTUP_FILES]
    if plugin is not None:
        files.append((f"{plugin}.py", reporter_source()))
    return files


def write_eval_dir(directory: str, script: str, log_parser: str, shell: str) -> None:
    """Write :func:`eval_files` to ``directory`` (root-owned, read-only to others), and copy ``shell``
    (a host path: the image's bash, copied out of it) there as :data:`SHELL_NAME`, root-owned,
    execute-only (0711)."""
    write_host_dir(directory, eval_files(script, log_parser))
    target = os.path.join(directory, SHELL_NAME)
    shutil.copyfile(shell, target, follow_symlinks=True)
    os.chown(target, 0, 0)
    os.chmod(target, 0o711)


def reframe_log(output: str, secrets: EvalSecrets) -> str:
    """The run's output with forged markers removed and the tagged ones made real markers again."""
    markers = _markers()
    tags = {secrets.tag(m): m for m in markers[:3]}
    out = []
    for line in output.split("\n"):
        if any(tag in line for tag in tags):
            for tag, marker in tags.items():
                line = line.replace(tag, marker)
            out.append(line)
        elif not any(m in line for m in markers):
            out.append(line)
    return "\n".join(out)


def grade_eval_run(
    spec: Any,
    result: SandboxResult,
    secrets: EvalSecrets,
    patch: str,
    declared: Mapping[str, str] | None = None,
    config: Mapping[str, str] | None = None,
) -> EvalOutcome:
    """Grade one run of :func:`eval_command` (``spec``: swebench's TestSpec) with swebench's report,
    held to the rule of :mod:`.code.outcomes`: ``declared`` is the original source of the graded
    test files (the image's, with the instance's test patch applied on the host; never the run's).
    The reporter's statuses are cross-checked against its own exit status (the host cannot see
    pytest's here: the container's exit status is the script's). ``config``: the original tree's
    configuration manifest (:mod:`.code.pytest_config`); a run whose manifest before the tests
    differs from it, or that printed none, is void."""
    from swebench.harness.constants import APPLY_PATCH_PASS, TESTS_ERROR, TESTS_TIMEOUT

    if config is not None:
        seen = secrets.config_manifest(result.text)
        if seen is None:
            return EvalOutcome(
                False, "void run: no pytest configuration manifest before the tests", log=result.text
            )
        changes = config_changes(config, seen)
        if changes:
            return EvalOutcome(
                False,
                "void run: the pytest configuration changed before the tests started: "
                + "; ".join(changes[:20]),
                log=result.text,
            )

    if uses_reporter(spec.log_parser):
        results = parse_results(result.text, secrets.key)
        if results.problem is None and not (result.timed_out or result.truncated or result.cancelled):
            results = check_exit(results, None)
        if results.problem is not None and not (result.timed_out or result.truncated):
            return EvalOutcome(False, f"no trustworthy test results: {results.problem}", log=result.text)
        log_text = f"{APPLY_PATCH_PASS}\n" + framed_log(
            result, results.log_body(skipped=False), results.exit_status
        )
        return grade_with_spec(spec, log_text, patch, declared)
    note = f"\n{TESTS_TIMEOUT}\n" if result.timed_out else f"\n{TESTS_ERROR}\n" if result.truncated else ""
    return grade_with_spec(
        spec, f"{APPLY_PATCH_PASS}\n{reframe_log(result.text, secrets)}{note}", patch, declared
    )


def warn_if_dumpable() -> None:
    """Warn once when the host keeps processes that exec an unreadable binary dumpable
    (``fs.suid_dumpable`` = 1): there the eval shell's memory, and the run's key, are readable by
    the code under test (see the module's limits)."""
    global _warned_dumpable
    if _warned_dumpable:
        return
    _warned_dumpable = True
    try:
        with open("/proc/sys/fs/suid_dumpable") as f:
            value = int(f.read().strip() or 0)
    except (OSError, ValueError):
        return
    if value == 1:
        log.warning(
            "fs.suid_dumpable is 1 on this host: code under test in a SWE-bench container can read the eval "
            "shell's memory and with it the run's key; set `sysctl fs.suid_dumpable=0` (or 2)"
        )
