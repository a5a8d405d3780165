"""tests/ mirrors the source, so a module's tests are found by its path.

The tests of ``src/thundersync_lightning/<pkg>/<sub>/<mod>.py`` live in ``tests/<pkg>/<sub>/`` as
``test_<mod>.py`` or, for one aspect of it, ``test_<mod>_<aspect>.py``. A file that tests a folder's
package as a whole, or one of its subpackages, is named after it (``tests/envs/test_envs_*.py``,
``tests/strategy/test_sharding.py``). At the root: the tests of the top-level modules
(``test_cli*.py``, ``test_export.py``, ...) and the whole-project checks listed in ``ROOT_CHECKS``.
Not mirrors: ``tests/peers/`` (checks against TRL and verl code, run in their own venv) and
``tests/benchmarks/`` (mirrors ``benchmarks/``); a folder without Python files holds data.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
PACKAGE = ROOT / "src" / "thundersync_lightning"
NOT_MIRRORS = ("peers", "benchmarks")
ROOT_CHECKS = {  # whole-project checks: what they test is the project, not one module
    "test_config_plans.py",  # every shipped config's memory plan
    "test_custom_doc.py",
    "test_design_doc.py",
    "test_layers.py",
    "test_moved_modules.py",
    "test_public_api.py",
    "test_readme.py",
    "test_tests_layout.py",
    "test_trl_doc.py",
    "test_unknown_options.py",  # every public constructor, across the layers
}


def _names(source: Path, *, own: bool) -> set[str]:
    """What a test file in the mirror of ``source`` may be named after: its modules, its
    subfolders and (``own``) the package itself."""
    names = {p.stem for p in source.glob("*.py") if p.stem != "__init__"}
    names |= {p.name for p in source.iterdir() if p.is_dir() and p.name != "__pycache__"}
    return names | {source.name} if own else names


def _names_a(test_file: str, names: set[str]) -> bool:
    subject = test_file.removeprefix("test_").removesuffix(".py")
    return any(subject == n or subject.startswith(n + "_") for n in names)


def misplaced(tests: Path, package: Path, root_checks: set[str]) -> list[str]:
    """Every folder and test file of ``tests`` that does not mirror ``package``, with the reason."""
    found = []
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        rel = folder.relative_to(tests)
        if rel.parts[0] in NOT_MIRRORS or "__pycache__" in rel.parts or not any(folder.glob("*.py")):
            continue
        source = package / rel
        if not (source / "__init__.py").exists():
            found.append(f"tests/{rel.as_posix()}/: no package {rel.as_posix()}/ in the source")
        elif not (folder / "__init__.py").exists():
            found.append(f"tests/{rel.as_posix()}/: no __init__.py (its tests import their helpers)")
        else:
            names = _names(source, own=True)
            found += [
                f"tests/{rel.as_posix()}/{f.name}: names no module or subpackage of {rel.as_posix()}/"
                for f in sorted(folder.glob("test_*.py"))
                if not _names_a(f.name, names)
            ]
    top_level = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    found += [
        f"tests/{f.name}: names no top-level module and is not a whole-project check"
        for f in sorted(tests.glob("test_*.py"))
        if f.name not in root_checks and not _names_a(f.name, top_level)
    ]
    return found


def test_every_test_folder_and_file_mirrors_the_source():
    assert misplaced(TESTS, PACKAGE, ROOT_CHECKS) == []


def test_every_whole_project_check_exists():
    assert sorted(c for c in ROOT_CHECKS if not (TESTS / c).exists()) == []


def test_a_test_named_after_no_module_and_a_folder_of_no_package_are_reported(tmp_path):
    package, tests = tmp_path / "pkg", tmp_path / "tests"
    for path in ("__init__.py", "cli.py", "core/__init__.py", "core/streaming.py", "core/grpo/__init__.py"):
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).touch()
    for path in (
        "__init__.py",
        "test_cli_errors.py",  # cli, an aspect
        "test_layers.py",  # a whole-project check
        "test_streaming.py",  # core's module, at the root
        "core/__init__.py",
        "core/test_streaming_bounds.py",
        "core/test_core_step0.py",  # the package as a whole
        "core/test_grpo.py",  # a subpackage
        "core/test_streamingly.py",  # a prefix of a name is no name
        "core/test_estimators.py",
        "core/data/step0.json",
        "core/accumulator/test_streaming.py",
        "peers/test_trl_peer.py",
    ):
        (tests / path).parent.mkdir(parents=True, exist_ok=True)
        (tests / path).touch()
    assert misplaced(tests, package, {"test_layers.py"}) == [
        "tests/core/test_estimators.py: names no module or subpackage of core/",
        "tests/core/test_streamingly.py: names no module or subpackage of core/",
        "tests/core/accumulator/: no package core/accumulator/ in the source",
        "tests/test_streaming.py: names no top-level module and is not a whole-project check",
    ]
