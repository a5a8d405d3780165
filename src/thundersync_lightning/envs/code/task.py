"""Local repository tasks: a small project, a problem statement, the tests that decide, a gold patch.

A task directory holds ``task.yaml``::

    problem_statement: |
      What is wrong, as a user would report it.
    FAIL_TO_PASS: [tests/test_x.py::test_new_behaviour]      # pytest node ids
    PASS_TO_PASS: [tests/test_x.py::test_old_behaviour]
    files:                                                    # the repository (or a repo/ folder)
      pkg/x.py: |
        ...
      tests/test_x.py: |
        ...

and optionally ``gold.patch`` (a unified diff that solves it). The shipped tasks live in
``thundersync_lightning/envs/code/tasks/<name>/`` (package data: YAML and .patch files).
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from ...core.errors import ConfigError
from ..repo.pytest_config import is_protected_path

__all__ = ["LocalTask", "load_task", "load_tasks", "shipped_tasks_dir", "without_tests"]


def shipped_tasks_dir() -> str:
    return str(Path(__file__).with_name("tasks"))


def without_tests(source: str, names: list[str]) -> str | None:
    """``source`` with the test functions/classes/methods ``names`` (``f``, ``C``, ``C::m``,
    parameters ``[...]`` ignored) cut out, decorators included; None when one cannot be found
    or the result does not parse (the caller then hides the whole file)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    spans: list[tuple[int, int]] = []
    for name in names:
        parts = [re.sub(r"\[.*\]$", "", p) for p in name.split("::")]
        body, node = tree.body, None
        for part in parts:
            node = next(
                (
                    n
                    for n in body
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.name == part
                ),
                None,
            )
            if node is None:
                return None
            body = node.body if isinstance(node, ast.ClassDef) else []
        assert node is not None
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        spans.append((first, node.end_lineno or node.lineno))
    lines = source.splitlines(keepends=True)
    cut = {i for a, b in spans for i in range(a - 1, b)}
    out = "".join(line for i, line in enumerate(lines) if i not in cut)
    try:
        ast.parse(out)
    except SyntaxError:
        return None
    return out


@dataclass(frozen=True, slots=True)
class LocalTask:
    """A picklable local task. ``files`` is ((relative path, text), ...) of the original repository."""

    name: str
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    files: tuple[tuple[str, str], ...]
    gold_patch: str | None = None

    @property
    def test_files(self) -> tuple[str, ...]:
        """Files named by the FAIL_TO_PASS / PASS_TO_PASS node ids, in first-seen order."""
        seen: dict[str, None] = {}
        for node in self.fail_to_pass + self.pass_to_pass:
            seen.setdefault(node.split("::", 1)[0], None)
        return tuple(seen)

    def protects(self, path: str) -> bool:
        return is_protected_path(path, self.test_files)

    def visible_files(self) -> tuple[tuple[str, str], ...]:
        """The repository as the agent sees it: the FAIL_TO_PASS tests are cut out of their files
        (a file where that fails is left out); they come back only at grading time, on a fresh
        copy of :attr:`files`, as SWE-bench's test patch does."""
        hidden: dict[str, list[str]] = {}
        for node in self.fail_to_pass:
            path, _, name = node.partition("::")
            hidden.setdefault(path, []).append(name)
        out = []
        for rel, text in self.files:
            if rel in hidden:
                names = hidden[rel]
                kept = None if "" in names else without_tests(text, names)
                if kept is None:
                    continue
                text = kept
            out.append((rel, text))
        return tuple(out)

    def materialize(self, dest: str, visible: bool = False) -> None:
        """Write the original repository (``visible``: the agent's view of it, see
        :meth:`visible_files`) into the (existing, empty) directory ``dest``."""
        for rel, text in self.visible_files() if visible else self.files:
            target = os.path.join(dest, rel)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w", encoding="utf-8") as f:
                f.write(text)


def _read_repo(repo: Path) -> tuple[tuple[str, str], ...]:
    out = []
    for p in sorted(repo.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            out.append((p.relative_to(repo).as_posix(), p.read_text(encoding="utf-8")))
    return tuple(out)


def load_task(directory: str | os.PathLike[str]) -> LocalTask:
    """Load one task directory; raises ConfigError listing every problem."""
    d = Path(directory)
    spec_path = d / "task.yaml"
    if not spec_path.is_file():
        raise ConfigError(f"task directory {str(d)!r} has no task.yaml")
    spec = yaml.safe_load(spec_path.read_text(encoding="utf-8")) or {}
    problems = [f"missing {k}" for k in ("problem_statement", "FAIL_TO_PASS") if not spec.get(k)]
    if spec.get("files"):
        files = tuple((str(k), str(v)) for k, v in sorted(spec["files"].items()))
    elif (d / "repo").is_dir():
        files = _read_repo(d / "repo")
    else:
        files = ()
        problems.append("no files: give a `files:` mapping or a repo/ folder")
    for rel, _ in files:
        if rel.startswith("/") or ".." in rel.split("/"):
            problems.append(f"file path {rel!r} must be relative, without '..'")
    if problems:
        raise ConfigError(f"task {str(d)!r}: " + "; ".join(problems))
    gold = d / "gold.patch"
    return LocalTask(
        name=str(spec.get("name", d.name)),
        problem_statement=str(spec["problem_statement"]).strip() + "\n",
        fail_to_pass=tuple(spec["FAIL_TO_PASS"]),
        pass_to_pass=tuple(spec.get("PASS_TO_PASS") or ()),
        files=files,
        gold_patch=gold.read_text(encoding="utf-8") if gold.is_file() else None,
    )


def load_tasks(root: str | os.PathLike[str] | None = None, names: list[str] | None = None) -> list[LocalTask]:
    """Every task directory under ``root`` (default: the shipped tasks), sorted by name."""
    base = Path(root) if root is not None else Path(shipped_tasks_dir())
    dirs = sorted(p for p in base.iterdir() if (p / "task.yaml").is_file()) if base.is_dir() else []
    tasks = [load_task(p) for p in dirs]
    if names is not None:
        by_name = {t.name: t for t in tasks}
        missing = [n for n in names if n not in by_name]
        if missing:
            raise ConfigError(
                f"unknown task names {missing}; available under {str(base)!r}: {sorted(by_name)}"
            )
        tasks = [by_name[n] for n in names]
    if not tasks:
        raise ConfigError(f"no tasks (directories with a task.yaml) under {str(base)!r}")
    return tasks
