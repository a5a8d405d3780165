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

import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from ...core.errors import ConfigError

__all__ = ["LocalTask", "load_task", "load_tasks", "shipped_tasks_dir", "is_protected_path"]

_PROTECTED_NAMES = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml",
                              "sitecustomize.py", "usercustomize.py", ".pth"})


def shipped_tasks_dir() -> str:
    return str(Path(__file__).with_name("tasks"))


def is_protected_path(path: str, test_files: tuple[str, ...] = ()) -> bool:
    """True for test files and files that configure the test run: changes to them never count."""
    path = path.strip()
    if path.startswith("./"):
        path = path[2:]
    parts = path.split("/")
    base = parts[-1]
    return (
        path in test_files
        or any(p in ("tests", "test", "testing") for p in parts[:-1])
        or (base.startswith("test_") and base.endswith(".py"))
        or base.endswith("_test.py")
        or base in _PROTECTED_NAMES
        or base.endswith(".pth")
        or "__pycache__" in parts
        or base.endswith(".pyc")
    )


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

    def materialize(self, dest: str) -> None:
        """Write the original repository into the (existing, empty) directory ``dest``."""
        for rel, text in self.files:
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
            raise ConfigError(f"unknown task names {missing}; available under {str(base)!r}: {sorted(by_name)}")
        tasks = [by_name[n] for n in names]
    if not tasks:
        raise ConfigError(f"no tasks (directories with a task.yaml) under {str(base)!r}")
    return tasks
