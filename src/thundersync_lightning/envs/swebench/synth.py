"""SWE-smith-style instances from a real library: one bug injected into a function its own tests cover.

(SWE-smith, arXiv 2504.21798.) A *site* is one operator or integer literal inside a function body,
of the kinds :func:`..mutation_sites.sites` knows (comparison, arithmetic also in ``+=``,
``and``/``or``, integer literal). A *candidate* replaces one site with another value of its kind by
rewriting only the site's bytes; the rest of the file keeps its text, so the gold patch is a one-line
diff. A candidate is kept only where the rewritten text parses to exactly the tree that the tree-level
edit gives (``ast.dump`` equal): a rewrite that would change anything else is never offered.

Selection (:func:`select_bugs`), all deterministic for a seed: the candidates in a fixed order,
shuffled by ``random.Random(seed)``; each is run against the library's targeted test files; it is
kept when at least one test that passed on the clean tree now fails (FAIL_TO_PASS: those tests,
at most ``max_fail_to_pass``); PASS_TO_PASS is a seeded sample of the tests that still pass. One bug
per function, so a library's instances are spread over its code. Test ids that swebench's pytest
log parser cannot read back whole (whitespace inside) are never graded.

The instance is the buggy tree at ``base_commit``; the gold patch (:func:`gold_patch`) restores the
clean text; the test patch is empty (the library's tests are already in the tree). The problem
statement (:func:`problem_statement`) describes the failing behaviour from the tests' own failure
messages and names the function, never the fix.
"""

from __future__ import annotations

import ast
import difflib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..mutation_sites import sites

__all__ = [
    "Site",
    "PytestRun",
    "Bug",
    "find_sites",
    "apply_site",
    "parse_test_run",
    "select_bugs",
    "gold_patch",
    "problem_statement",
    "eval_script",
    "gradable",
]

_SYMBOL = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.And: "and",
    ast.Or: "or",
}
# Exactly one token of the site's kind may lie between its operands (parentheses and spaces aside).
_CMP_TOKEN = re.compile(r"<=|>=|==|!=|<|>")
_BIN_TOKEN = re.compile(r"\*\*|//|[+\-*%/@&|^]|<<|>>")
_BOOL_TOKEN = re.compile(r"\b(?:and|or)\b")
_KIND = {
    ast.Compare: "cmp_flip",
    ast.BinOp: "op_swap",
    ast.AugAssign: "op_swap",
    ast.BoolOp: "bool_swap",
    ast.Constant: "const_shift",
}
_STATUSES = ("PASSED", "FAILED", "ERROR", "XFAIL", "XPASS")  # SKIPPED lines name a file:line, not a test id
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+)(?: - (.*))?$")


@dataclass(frozen=True, slots=True)
class Site:
    """One candidate edit of ``path``: bytes ``start:end`` (``old``) become ``new``, inside
    ``function`` (its dotted qualified name), on ``line``. ``index``: the site's position in
    :func:`..mutation_sites.sites`'s walk of the module; ``kind``: ``cmp_flip``,
    ``op_swap``, ``bool_swap`` or ``const_shift``."""

    path: str
    function: str
    line: int
    start: int
    end: int
    old: str
    new: str
    index: int
    kind: str

    @property
    def key(self) -> str:
        """A stable name of the edit (sorting, instance ids)."""
        return f"{self.path}:{self.start}:{self.old}->{self.new}"


@dataclass(frozen=True, slots=True)
class PytestRun:
    """One pytest run's results (swebench's parser: test id -> status) and failure messages."""

    statuses: dict[str, str]
    messages: dict[str, str]

    def passed(self) -> set[str]:
        return {t for t, s in self.statuses.items() if s == "PASSED"}


@dataclass(frozen=True, slots=True)
class Bug:
    """A kept candidate: the tests it breaks and a sample of those it leaves passing."""

    site: Site
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    messages: tuple[tuple[str, str], ...]  # (test id, failure message) of the first few FAIL_TO_PASS


def _functions(tree: ast.AST) -> dict[int, str]:
    """id(node) -> the qualified name of the innermost function whose body holds it (a docstring,
    decorators, defaults and annotations are not the body)."""
    owner: dict[int, str] = {}

    def visit(node: ast.AST, scope: str, func: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            handle(child, scope, func)

    def handle(node: ast.AST, scope: str, func: str | None) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{scope}{node.name}"
            for part in (*node.decorator_list, node.args, *([node.returns] if node.returns else [])):
                handle(part, scope, func)
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                body = body[1:]
            for stmt in body:
                handle(stmt, f"{name}.", name)
        elif isinstance(node, ast.ClassDef):
            visit(node, f"{scope}{node.name}.", func)
        else:
            if func is not None:
                owner[id(node)] = func
            visit(node, scope, func)

    visit(tree, "", None)
    return owner


def _offsets(data: bytes) -> list[int]:
    """Byte offset of each line's start (ast positions are line + UTF-8 byte column)."""
    starts = [0]
    for i, b in enumerate(data):
        if b == 0x0A:
            starts.append(i + 1)
    return starts


def _span(node: ast.AST, index: int | None, data: bytes, lines: list[int]) -> tuple[int, int] | None:
    """The byte span of the site's token in ``data`` (None: not exactly one token of its kind there)."""

    def at(line: int, col: int) -> int:
        return lines[line - 1] + col

    if isinstance(node, ast.Constant):
        start, end = at(node.lineno, node.col_offset), at(node.end_lineno, node.end_col_offset)
        text = data[start:end].decode()
        return (start, end) if re.fullmatch(r"[0-9]+", text) and int(text) == node.value else None
    if isinstance(node, ast.Compare):
        assert index is not None
        left = node.left if index == 0 else node.comparators[index - 1]
        lo, hi, pattern = left, node.comparators[index], _CMP_TOKEN
    elif isinstance(node, ast.BinOp):
        lo, hi, pattern = node.left, node.right, _BIN_TOKEN
    elif isinstance(node, ast.AugAssign):
        lo, hi, pattern = node.target, node.value, re.compile(r"(?:\*\*|//|>>|<<|[+\-*%/@&|^])=")
    elif isinstance(node, ast.BoolOp):
        if len(node.values) != 2:
            return None
        lo, hi, pattern = node.values[0], node.values[1], _BOOL_TOKEN
    else:
        return None
    a, b = at(lo.end_lineno, lo.end_col_offset), at(hi.lineno, hi.col_offset)
    between = data[a:b].decode()
    if "#" in between or "\\" in between:
        return None
    found = list(pattern.finditer(between))
    if len(found) != 1:
        return None
    return a + found[0].start(), a + found[0].end()


def _text(value: object, aug: bool) -> str:
    if isinstance(value, int):
        return str(value)
    return _SYMBOL[type(value)] + ("=" if aug else "")


def find_sites(path: str, source: str) -> list[Site]:
    """Every candidate edit of ``source`` (the file at ``path``) inside a function body, sorted by
    position then replacement; each rewrites only its site's bytes and reproduces the tree edit."""
    data = source.encode()
    tree = ast.parse(source)
    owner = _functions(tree)
    lines = _offsets(data)
    out: list[Site] = []
    for index, (node, _, slot, alternatives) in enumerate(sites(tree)):
        name = owner.get(id(node))
        if name is None:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            continue
        span = _span(node, slot, data, lines)
        if span is None:
            continue
        old = data[span[0] : span[1]].decode()
        for alt in alternatives:
            value = alt() if isinstance(alt, type) else alt
            if isinstance(value, int) and value < 0:
                continue  # "-1" in place of "0" parses as a unary minus: not the tree edit
            new = _text(value, isinstance(node, ast.AugAssign))
            out.append(Site(path, name, node.lineno, span[0], span[1], old, new, index, _KIND[type(node)]))
    return sorted(out, key=lambda s: (s.start, s.new))


def apply_site(source: str, site: Site) -> str | None:
    """``source`` with ``site`` applied, or None where the text edit is not exactly the tree edit
    (what :mod:`..mutations.generate` would make of the same site)."""
    data = source.encode()
    if data[site.start : site.end].decode() != site.old:
        return None
    mutated = (data[: site.start] + site.new.encode() + data[site.end :]).decode()
    try:
        got = ast.parse(mutated)
    except SyntaxError:
        return None
    want = ast.parse(source)
    node, field, slot, _ = sites(want)[site.index]
    value: object
    if isinstance(node, ast.Constant):
        value = int(site.new)
    else:
        symbol = site.new[:-1] if isinstance(node, ast.AugAssign) else site.new
        value = next(op() for op, s in _SYMBOL.items() if s == symbol)
    if slot is None:
        setattr(node, field, value)
    else:
        getattr(node, field)[slot] = value
    return mutated if ast.dump(got) == ast.dump(want) else None


def gradable(test_id: str) -> bool:
    """Whether swebench's pytest log parser reads ``test_id`` back whole (it splits lines on spaces)."""
    return bool(test_id) and not any(c.isspace() for c in test_id)


def parse_test_run(log: str) -> PytestRun:
    """Statuses as swebench's ``parse_log_pytest`` reads them from a ``pytest -rA`` log, and the
    short failure messages of its summary lines (memory addresses blanked: they differ per run).
    A test whose id holds whitespace (a parametrization with spaces) is left out: the parser keeps
    only its first word, which may stand for several tests."""
    from swebench.harness.log_parsers.python import parse_log_pytest

    statuses = parse_log_pytest(log, None)
    messages: dict[str, str] = {}
    for line in log.split("\n"):
        status, _, rest = line.partition(" ")
        if status in _STATUSES:
            full = rest.split(" - ", 1)[0] if status in ("FAILED", "ERROR") else rest
            if not gradable(full.strip()):  # the parser kept its first word: a cut, ambiguous id
                statuses.pop(full.split()[0] if full.split() else "", None)
                continue
        m = _RESULT.match(line)
        if m and m.group(1) in ("FAILED", "ERROR") and m.group(3):
            messages[m.group(2)] = re.sub(r"0x[0-9a-fA-F]+", "0x...", m.group(3)).strip()[:300]
    return PytestRun(statuses, messages)


def select_bugs(
    candidates: Sequence[Site],
    baseline: PytestRun,
    run: Callable[[Site], PytestRun | None],
    *,
    seed: int,
    count: int,
    max_tries: int,
    max_fail_to_pass: int = 10,
    num_pass_to_pass: int = 10,
    num_messages: int = 3,
) -> list[Bug]:
    """Up to ``count`` bugs from ``candidates``, trying at most ``max_tries`` of them in a seeded
    order. ``run(site)`` runs the targeted tests on the tree with ``site`` applied (None: the run
    failed as a whole: timed out, crashed; the candidate is skipped)."""
    clean = {t for t in baseline.passed() if gradable(t)}
    order = sorted(candidates, key=lambda s: s.key)
    rng = random.Random(seed)
    rng.shuffle(order)
    bugs: list[Bug] = []
    used: set[tuple[str, str]] = set()
    tries = 0
    for site in order:
        if len(bugs) >= count or tries >= max_tries:
            break
        if (site.path, site.function) in used:
            continue
        tries += 1
        result = run(site)
        if result is None:
            continue
        passing = result.passed()
        broken = sorted(clean - passing)
        if not broken or len(broken) > max_fail_to_pass:
            continue
        still = sorted(clean & passing)
        sample = sorted(rng.sample(still, min(num_pass_to_pass, len(still))))
        messages = tuple((t, result.messages.get(t, "")) for t in broken[:num_messages])
        bugs.append(Bug(site, tuple(broken), tuple(sample), messages))
        used.add((site.path, site.function))
    return bugs


def gold_patch(path: str, buggy: str, clean: str) -> str:
    """The fix as a git-style unified diff of ``path`` (buggy -> clean), three lines of context."""
    if not buggy.endswith("\n") or not clean.endswith("\n"):
        raise ValueError(f"{path}: the file must end with a newline (a diff of its last line needs a marker)")
    hunks = difflib.unified_diff(
        buggy.splitlines(keepends=True), clean.splitlines(keepends=True), f"a/{path}", f"b/{path}", n=3
    )
    body = "".join(hunks)
    return f"diff --git a/{path} b/{path}\n{body}" if body else ""


def problem_statement(bug: Bug, test_files: Sequence[str]) -> str:
    """The issue text: the function that misbehaves and how its tests fail (never the fix)."""
    site = bug.site
    shown = "".join(f"    {t}\n        {msg or '(failed)'}\n" for t, msg in bug.messages)
    more = len(bug.fail_to_pass) - len(bug.messages)
    tail = f"    ... and {more} more failing test(s)\n" if more > 0 else ""
    return (
        f"`{site.function}` in `{site.path}` gives wrong results.\n\n"
        f"After a recent change, {len(bug.fail_to_pass)} test(s) of the library's own suite fail "
        f"({', '.join(test_files)}):\n\n{shown}{tail}\n"
        "The tests describe the intended behaviour and are correct; fix the library code so that "
        "they pass again without breaking the other tests.\n"
    )


def eval_script(
    base_commit: str, test_files: Sequence[str], pytest_args: Sequence[str] = (), pythonpath: str = ""
) -> str:
    """swebench's eval-script shape: restore the test files from the base, run the targeted tests
    between the markers with ``-rA`` (what the pytest log parser reads), restore again.
    ``pythonpath`` (a src layout) is exported before the start marker, never set on the test
    command: the eval run adds its reporter's directory to the exported value."""
    files = " ".join(test_files)
    args = "".join(f" {a}" for a in pytest_args)
    # exported before the start marker: the graded run's harness prepends its own entry to it
    env = [f"export PYTHONPATH={pythonpath}"] if pythonpath else []
    return (
        "\n".join(
            [
                "#!/bin/bash",
                "set -uxo pipefail",
                "cd /testbed",
                *env,
                f"git -c core.hooksPath=/dev/null checkout {base_commit} -- {files}",
                ": '>>>>> Start Test Output'",
                f"python3 -m pytest -rA --tb=no -p no:cacheprovider{args} {files}",
                ": '>>>>> End Test Output'",
                f"git -c core.hooksPath=/dev/null checkout {base_commit} -- {files}",
            ]
        )
        + "\n"
    )
