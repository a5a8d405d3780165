"""A graded test passes only if it ran and passed.

pytest lets the code under test decide at run time how a test is reported: ``pytest.skip()``,
``pytest.xfail()``, ``pytest.importorskip()`` or ``raise unittest.SkipTest`` from inside the function
under test, ``pytest.skip(allow_module_level=True)`` while its module is imported, or ``skip`` /
``skipif`` / ``xfail`` / ``xfail(run=False)`` markers added to the running items (``item.add_marker``
on items reached through the session with ``gc``). The reporter signs such outcomes faithfully
(``XFAIL``, ``SKIPPED``), and swebench's grading counts an expected failure as a pass (and, in older
versions, a skip as "maintained"): a one-line reward hack.

Rule, applied to swebench's status map of the graded ids (FAIL_TO_PASS and PASS_TO_PASS), whatever
produced it (the local runner's reporter, the container path's reporter, or another log parser)::

    PASSED                       counts as passed
    XFAIL / SKIPPED              counts as that status only when the test's original source carries
                                 the marker itself (see :func:`declared_markers`); else a failure
    anything else, or missing    a failure (missing: only with eval type pass_and_fail, where
                                 swebench too needs the test to be reported)

The original source is read on the host from the task's files (local tasks: ``LocalTask.files``;
SWE-bench: the image's ``/testbed`` with the instance's ``test_patch`` applied on the host), never
from the run. Every failure the rule adds carries a reason naming the id and its status.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping, Sequence

__all__ = ["declared_markers", "judge_statuses", "MARKER_OF_STATUS"]

# The status a marker may legitimately produce, and the word that declares it in the source.
MARKER_OF_STATUS = {"XFAIL": "xfail", "SKIPPED": "skip"}
# The names (pytest's and unittest's) that declare them, as identifiers (``Name`` or ``Attribute``).
_NAMES = {
    "xfail": frozenset({"xfail", "expectedFailure"}),
    "skip": frozenset({"skip", "skipif", "skipIf", "skipUnless", "skipTest", "importorskip", "SkipTest"}),
}


def _names(nodes: list[ast.AST]) -> set[str]:
    out = set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                out.add(sub.id)
            elif isinstance(sub, ast.Attribute):
                out.add(sub.attr)
    return out


def _marking_nodes(tree: ast.Module, path: list[str]) -> list[ast.AST] | None:
    """The nodes that can mark the test ``path`` (class names then the function name): each
    enclosing class's decorators and ``pytestmark``, the module's ``pytestmark``, the function's
    decorators and body. None when the test is not defined in this module."""
    out: list[ast.AST] = []

    def marks_of(body: list[ast.stmt]) -> None:
        for node in body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            if any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
                out.append(node)

    body: list[ast.stmt] = tree.body
    marks_of(body)
    for i, name in enumerate(path):
        node = next(
            (
                n
                for n in body
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == name
            ),
            None,
        )
        if node is None:
            return None
        out += node.decorator_list
        if isinstance(node, ast.ClassDef):
            marks_of(node.body)
            body = node.body
        elif i == len(path) - 1:
            out += node.body
        else:
            return None
    return out


def declared_markers(sources: Mapping[str, str], test_id: str) -> frozenset[str]:
    """Markers (``"xfail"``, ``"skip"``) the original source of ``test_id`` (a pytest node id,
    ``path::[Class::]name[params]``) carries on the test itself: in its decorators (parametrize
    ``marks=`` included), its classes' decorators, a module or class ``pytestmark``, or a skip /
    xfail call in its own body. Empty when the file or the test is not in ``sources`` (ids of other
    frameworks included): such a test must pass."""
    path, sep, rest = test_id.partition("::")
    if not sep or path not in sources:
        return frozenset()
    names = [re.sub(r"\[.*\]$", "", part) for part in rest.split("::")]
    try:
        tree = ast.parse(sources[path])
    except (SyntaxError, ValueError):
        return frozenset()
    nodes = _marking_nodes(tree, names)
    if nodes is None:
        return frozenset()
    used = _names(nodes)
    return frozenset(marker for marker, words in _NAMES.items() if used & words)


def judge_statuses(
    status_map: Mapping[str, str],
    graded: Sequence[str],
    sources: Mapping[str, str],
    *,
    missing_fails: bool = True,
    resolve: Callable[[str, Mapping[str, str]], str | None] | None = None,
) -> list[str]:
    """The reasons why graded ids did not pass under the rule above (empty: every graded id
    passed or carries, in its original source, the marker of its status). ``resolve`` maps an id
    to its key in ``status_map`` (swebench's tolerance of truncated parametrized ids)."""
    problems = []
    for test_id in dict.fromkeys(graded):
        key = (
            resolve(test_id, status_map)
            if resolve is not None
            else (test_id if test_id in status_map else None)
        )
        status = status_map.get(key) if key is not None else None
        if status == "PASSED":
            continue
        if status is None:
            if missing_fails:
                problems.append(f"{test_id}: did not run")
            continue
        marker = MARKER_OF_STATUS.get(status)
        if marker is None:
            problems.append(f"{test_id}: {status}")
        elif marker not in declared_markers(sources, test_id):
            problems.append(
                f"{test_id}: {status} at run time, and the task's source does not mark it {marker}"
            )
    return problems
