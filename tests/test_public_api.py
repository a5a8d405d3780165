"""The public API: every package says what it exports (``__all__``), each name is exported by one
top-level package, every exported name exists, and importing a family's task source from
``thundersync_lightning.envs`` loads that family only."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import thundersync_lightning

PACKAGE = Path(thundersync_lightning.__file__).parent
TOP = ("core", "planning", "backends", "strategy", "rollout", "envs", "modules", "callbacks")


def _packages() -> list[str]:
    found = ["thundersync_lightning"]
    for info in pkgutil.walk_packages(thundersync_lightning.__path__, "thundersync_lightning."):
        if info.ispkg:
            found.append(info.name)
    return found


def test_every_package_declares_its_exports():
    missing = [name for name in _packages() if not hasattr(importlib.import_module(name), "__all__")]
    assert missing == []


def test_every_exported_name_exists_and_is_exported_by_one_top_level_package():
    exporters = defaultdict(list)
    for top in TOP:
        module = importlib.import_module(f"thundersync_lightning.{top}")
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{top}.{name}"
            exporters[name].append(top)
    assert {n: where for n, where in exporters.items() if len(where) > 1} == {}


def test_the_rollout_types_are_the_cores_and_still_importable_from_rollout():
    from thundersync_lightning import core, rollout

    assert "Trajectory" in core.__all__ and "Trajectory" not in rollout.__all__
    assert rollout.Trajectory is core.Trajectory


def test_a_task_source_imported_from_envs_loads_its_family_only():
    code = (
        "import sys; from thundersync_lightning.envs import GuessingGameTasks; "
        "print(GuessingGameTasks.__module__); "
        "print(sorted(m for m in sys.modules if m.startswith('thundersync_lightning.envs.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "thundersync_lightning.envs.toy.source"
    loaded = eval(out[1])  # noqa: S307 - our own printed list
    envs = Path(thundersync_lightning.__file__).parent / "envs"
    families = {p.name for p in envs.iterdir() if (p / "source.py").is_file()}  # the rest: the toolkit
    assert "toy" in families
    assert not [m for m in loaded if m.split(".")[2] in families - {"toy"}], loaded


def test_no_package_exports_through_a_star_import_and_the_core_names_every_error():
    from thundersync_lightning import core
    from thundersync_lightning.core import errors

    starred = [
        str(init.relative_to(PACKAGE))
        for init in PACKAGE.rglob("__init__.py")
        if re.search(r"^\s*from \S+ import \*", init.read_text(), re.M)
    ]
    assert starred == []
    assert set(errors.__all__) <= set(core.__all__)


def test_every_code_example_of_the_docs_imports_from_a_package_not_a_module_inside_one():
    """A module moved behind its package's ``__all__`` then breaks no user who copied an example."""
    root = PACKAGE.parents[1]
    docs = [root / "README.md", root / "benchmarks" / "README.md", *(root / "docs").glob("*.md")]
    imported = re.compile(r"^\s*from (thundersync_lightning[\w.]*) import", re.M)
    deep = [
        f"{doc.relative_to(root)}: {name}"
        for doc in docs
        for name in imported.findall(doc.read_text())
        if not (PACKAGE.parent / name.replace(".", "/") / "__init__.py").exists()
    ]
    assert deep == []
