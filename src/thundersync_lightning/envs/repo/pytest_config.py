"""The files that configure a pytest run or run code before it, and a check that the graded run's
are the instance's own.

pytest reads its configuration from the first of ``pytest.ini``, ``.pytest.ini``,
``pyproject.toml``, ``tox.ini`` and ``setup.cfg`` it finds (``addopts = -p <module>`` there loads
a plugin before any given on the command line or in ``PYTEST_ADDOPTS``), every ``conftest.py``
under the root, and entry-point plugins (``entry_points.txt`` of a ``*.dist-info`` /
``*.egg-info``). Python itself imports ``sitecustomize`` and ``usercustomize`` at start-up from
anywhere on ``sys.path``, as a module, a package, an extension module or bytecode; and a package
or an extension module named like a test module wins over the ``.py`` file in the same directory
(``tests/test_x/__init__.py``, ``tests/test_x.cpython-311-x86_64-linux-gnu.so`` shadow
``tests/test_x.py``: a package that sets ``__file__`` to the test file's path and defines the
graded test names passes pytest's import check). An agent that changes one of them changes how its
tests are run:

- **in its patch**: every such path is a protected path (:func:`is_protected_path`), so
  a diff touching one is dropped before grading;
- **through the install step** of an eval script (SWE-bench's ``pip install -e .`` runs the
  agent's ``setup.py``, which can rewrite ``setup.cfg``, write a ``.pytest.ini`` or a
  ``tests/test_x/`` package): right before the tests start, after every other process of the run
  was killed, the eval shell prints a manifest of these files (:func:`manifest_command`: their
  paths and SHA-256 digests, :func:`listed` says which), each line tagged with a key-derived tag
  the code under test cannot forge; the host compares it with the manifest of the original tree
  (:func:`config_changes`) and a difference voids the run (reward 0, the changed paths in the
  verdict's reason).

The manifest needs ``find``, ``sort``, ``xargs`` and ``sha256sum`` (GNU findutils and coreutils,
in every SWE-bench image).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping
from fnmatch import fnmatchcase

__all__ = [
    "CONFIG_FILE_NAMES",
    "PLUGIN_FILE_NAMES",
    "STARTUP_MODULES",
    "manifest_command",
    "parse_manifest",
    "config_changes",
    "with_contents",
    "listed",
    "module_name",
    "is_protected_path",
]

#: Files pytest reads its configuration from (any directory).
CONFIG_FILE_NAMES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "conftest.py")
#: Files that declare plugins pytest loads by itself (``pytest11`` entry points).
PLUGIN_FILE_NAMES = ("entry_points.txt",)
#: Modules Python imports at start-up from anywhere on ``sys.path``.
STARTUP_MODULES = ("sitecustomize", "usercustomize")
# What the manifest lists, as find matches it (one source for the shell command and :func:`listed`):
# file names (``-name``), full paths (``-path``: ``*`` crosses ``/``), and links by name (a linked
# directory is not descended into, so the link itself stands for it).
_NAMES = (
    *CONFIG_FILE_NAMES,
    *PLUGIN_FILE_NAMES,
    *(f"{m}*" for m in STARTUP_MODULES),
    "test_*.so",
    "*_test.so",
    "*_test.*.so",
)
_PATHS = (*(f"*/{m}/*" for m in STARTUP_MODULES), "*/test_*/__init__.py", "*/*_test/__init__.py")
_LINKS = ("test_*", "*_test")

_LINE = re.compile(r"^\\?([0-9a-f]{64})  (.*)$")


def module_name(part: str) -> str:
    """The module a path component is imported as (``x.cpython-311-x86_64-linux-gnu.so``, ``x.py``,
    a directory ``x``: ``x``)."""
    return part.split(".", 1)[0]


def listed(path: str) -> bool:
    """Whether the manifest lists the regular file at ``path`` (an absolute path in the tree)."""
    name = path.rsplit("/", 1)[-1]
    return any(fnmatchcase(name, p) for p in _NAMES) or any(fnmatchcase(path, p) for p in _PATHS)


def manifest_command(root: str = "/testbed") -> str:
    """A shell pipeline printing ``<sha256>  <path>`` for every file under ``root`` that
    :func:`listed` names (``.git`` skipped; a link is listed by its target's digest, as a file it
    stands for is read), sorted by path."""
    q = shlex.quote
    names = " -o ".join([*(f"-name {q(n)}" for n in _NAMES), *(f"-path {q(p)}" for p in _PATHS)])
    links = " -o ".join(f"-name {q(n)}" for n in _LINKS)
    r = q(root)
    return (
        f"find {r} -path {q(root.rstrip('/') + '/.git')} -prune -o \\( \\( {names} \\) "
        f"\\( -type f -o -type l \\) \\) -print0 -o \\( -type l \\( {links} \\) \\) -print0 2>/dev/null "
        "| LC_ALL=C sort -z | LC_ALL=C xargs -0 -r sha256sum -- 2>&1"
    )


def parse_manifest(text: str) -> dict[str, str]:
    """path -> digest of a manifest's lines; a line that is not one (an unreadable file's error)
    stands for itself with the digest ``"?"``, so it differs from any readable file."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _LINE.match(line)
        if m:
            out[m.group(2)] = m.group(1)
        else:
            out[line] = "?"
    return out


def with_contents(
    manifest: Mapping[str, str], files: Mapping[str, bytes | None], root: str = "/testbed"
) -> dict[str, str]:
    """``manifest`` with the files of ``files`` (path relative to ``root`` -> content, None:
    deleted) in their new state: the original tree's manifest once the instance's test patch is
    applied, when that patch touches a configuration file."""
    out = dict(manifest)
    base = root.rstrip("/") + "/"
    for rel, content in files.items():
        if not listed(base + rel):
            continue
        if content is None:
            out.pop(base + rel, None)
        else:
            out[base + rel] = hashlib.sha256(content).hexdigest()
    return out


def config_changes(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """Each path whose file was added, removed or changed, with how (empty: the same files). An
    extension module the tree had (``*.so``) counts by presence: an install step that rebuilds the
    repository's own extensions rarely reproduces their bytes, and that must not void a run."""
    out = []
    for path in sorted(set(expected) | set(actual)):
        if path not in actual:
            out.append(f"{path} removed")
        elif path not in expected:
            out.append(f"{path} added")
        elif expected[path] != actual[path] and not path.endswith(".so"):
            out.append(f"{path} changed")
    return out


_PROTECTED_NAMES = frozenset(
    {*CONFIG_FILE_NAMES, *PLUGIN_FILE_NAMES, ".gitattributes", ".gitmodules", "pytest.py"}
)
_TEST_DIRS = frozenset({"tests", "test", "testing"})


def _shadows_a_test_module(module: str, graded: frozenset[str]) -> bool:
    """A module (or package) of this name would win over a test module of the same name in its directory."""
    return module.startswith("test_") or module.endswith("_test") or module in graded


def is_protected_path(path: str, test_files: tuple[str, ...] = ()) -> bool:
    """True for test files and files that configure the test run or run code before it: changes to
    them never count. Besides the names: every form Python imports a start-up module
    (``sitecustomize``, ``usercustomize``) or a test module from (a module of any suffix, a package
    directory, an extension module: ``test_x/__init__.py`` or ``test_x.cpython-311-x86_64-linux-gnu.so``
    shadow ``test_x.py``), for pytest's default test module names and those of ``test_files``."""
    path = path.strip()
    if path.startswith("./"):
        path = path[2:]
    parts = path.split("/")
    base = parts[-1]
    modules = [module_name(p) for p in parts]
    graded = frozenset(module_name(f.rsplit("/", 1)[-1]) for f in test_files)
    return (
        path in test_files
        or any(p in _TEST_DIRS for p in parts[:-1])
        or any(m in STARTUP_MODULES or _shadows_a_test_module(m, graded) for m in modules)
        or base in _PROTECTED_NAMES
        or base.endswith(".pth")
        or "__pycache__" in parts
        or base.endswith(".pyc")
        or any(p.endswith((".dist-info", ".egg-info")) for p in parts[:-1])
    )
