"""The files that configure a pytest run, and a check that the graded run's are the instance's own.

pytest reads its configuration from the first of ``pytest.ini``, ``.pytest.ini``,
``pyproject.toml``, ``tox.ini`` and ``setup.cfg`` it finds (``addopts = -p <module>`` there loads
a plugin before any given on the command line or in ``PYTEST_ADDOPTS``), every ``conftest.py``
under the root, and entry-point plugins (``entry_points.txt`` of a ``*.dist-info`` /
``*.egg-info``). An agent that changes one of them changes how its tests are run:

- **in its patch**: every such name is a protected path (:func:`~.task.is_protected_path`), so
  a diff touching one is dropped before grading;
- **through the install step** of an eval script (SWE-bench's ``pip install -e .`` runs the
  agent's ``setup.py``, which can rewrite ``setup.cfg`` or write a ``.pytest.ini``): right before
  the tests start, after every other process of the run was killed, the eval shell prints a
  manifest of these files (:func:`manifest_command`: their paths and SHA-256 digests), each line
  tagged with a key-derived tag the code under test cannot forge; the host compares it with the
  manifest of the original tree (:func:`config_changes`) and a difference voids the run (reward 0,
  the changed paths in the verdict's reason).

The manifest needs ``find``, ``sort``, ``xargs`` and ``sha256sum`` (GNU findutils and coreutils,
in every SWE-bench image).
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping

__all__ = ["CONFIG_FILE_NAMES", "PLUGIN_FILE_NAMES", "manifest_command", "parse_manifest", "config_changes",
           "with_contents"]

#: Files pytest reads its configuration from (any directory).
CONFIG_FILE_NAMES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg", "conftest.py")
#: Files that declare plugins pytest loads by itself (``pytest11`` entry points).
PLUGIN_FILE_NAMES = ("entry_points.txt",)

_LINE = re.compile(r"^\\?([0-9a-f]{64})  (.*)$")


def manifest_command(root: str = "/testbed") -> str:
    """A shell pipeline printing ``<sha256>  <path>`` for every configuration or plugin file under
    ``root`` (``.git`` skipped; links followed, as pytest would), sorted by path."""
    names = " -o ".join(f"-name {shlex.quote(n)}" for n in (*CONFIG_FILE_NAMES, *PLUGIN_FILE_NAMES))
    r = shlex.quote(root)
    return (f"find {r} -path {shlex.quote(root.rstrip('/') + '/.git')} -prune -o \\( {names} \\) "
            "\\( -type f -o -type l \\) -print0 2>/dev/null | LC_ALL=C sort -z | LC_ALL=C xargs -0 -r sha256sum -- 2>&1")


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


def with_contents(manifest: Mapping[str, str], files: Mapping[str, bytes | None], root: str = "/testbed") -> dict[str, str]:
    """``manifest`` with the files of ``files`` (path relative to ``root`` -> content, None:
    deleted) in their new state: the original tree's manifest once the instance's test patch is
    applied, when that patch touches a configuration file."""
    out = dict(manifest)
    base = root.rstrip("/") + "/"
    for rel, content in files.items():
        name = rel.rsplit("/", 1)[-1]
        if name not in CONFIG_FILE_NAMES and name not in PLUGIN_FILE_NAMES:
            continue
        if content is None:
            out.pop(base + rel, None)
        else:
            out[base + rel] = hashlib.sha256(content).hexdigest()
    return out


def config_changes(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """Each path whose file was added, removed or changed, with how (empty: the same files)."""
    out = []
    for path in sorted(set(expected) | set(actual)):
        if path not in actual:
            out.append(f"{path} removed")
        elif path not in expected:
            out.append(f"{path} added")
        elif expected[path] != actual[path]:
            out.append(f"{path} changed")
    return out
