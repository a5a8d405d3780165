"""The agent's patch: captured with a host-controlled git, judged by git's own parse of its paths.

Capture (:func:`capture_command`): the diff is computed inside the sandbox (as the sandbox's uid,
so nothing it runs can touch the host) by a git whose every input the host controls except the
work tree: ``GIT_DIR`` is a read-only, host-made bare copy of the original commit (so the agent's
``.git/config`` with its filters, hooks, fsmonitor, textconv or external diff drivers is never
read), global/system config is ``/dev/null``, the index and new objects live in the run's private
``/tmp``, external diff and textconv are off, and stderr is discarded: the patch is git's stdout
only. ``.gitattributes`` files in the work tree can still name filter drivers, but no driver is
configured, so none runs.

Judgement (:func:`filter_patch`): which files a patch touches is decided by ``git apply --numstat
-z`` (forward and ``--reverse``, so both sides of renames and copies are seen) on the host, the
same parser that applies it: C-quoted names (``"a/t\\145sts/x.py"``), renames, mode changes and
deletions come out as the real paths. File diffs touching a protected path are dropped; anything
git cannot parse consistently with our split drops the whole patch (fail closed); the result is
re-parsed and must touch no protected path.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable

__all__ = ["patch_paths", "split_patch", "filter_patch", "capture_command", "BASE_GIT_DIR"]

BASE_GIT_DIR = "/tsl-base.git"  # where the host's bare copy of the original commit is bound (read-only)
_MAX_FILES = 2000

_HOST_GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/nonexistent",
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_ATTR_NOSYSTEM": "1",
    "LC_ALL": "C",
}


def _numstat(patch: bytes, reverse: bool) -> list[str] | None:
    """One path per file diff, as git parses ``patch`` (None when git rejects it)."""
    with tempfile.TemporaryDirectory(prefix="tsl-numstat-") as empty:
        env = dict(_HOST_GIT_ENV, GIT_CEILING_DIRECTORIES=os.path.dirname(empty))
        args = ["git", "apply", "--numstat", "-z", *(["--reverse"] if reverse else []), "-"]
        try:
            r = subprocess.run(args, input=patch, cwd=empty, env=env, capture_output=True, timeout=120)
        except (OSError, subprocess.SubprocessError):
            return None
    if r.returncode != 0:
        return None
    fields = r.stdout.split(b"\0")
    paths: list[str] = []
    i = 0
    while i < len(fields) and fields[i]:
        parts = fields[i].split(b"\t", 2)
        if len(parts) != 3:
            return None
        if parts[2]:
            paths.append(parts[2].decode("utf-8", "surrogateescape"))
            i += 1
        else:  # rename/copy form: "added\tdeleted\t\0from\0to\0"
            if i + 2 >= len(fields):
                return None
            paths.append(fields[i + 1].decode("utf-8", "surrogateescape"))
            paths.append(fields[i + 2].decode("utf-8", "surrogateescape"))
            i += 3
    return paths


def _chunks(patch: str) -> list[str]:
    """The file diffs of ``patch``: text from each ``diff --git`` line to the next (text before
    the first header is dropped)."""
    out: list[str] = []
    for line in patch.splitlines(keepends=True):
        if line.startswith("diff --git "):
            out.append(line)
        elif out:
            out[-1] += line
    return out


def patch_paths(patch: str) -> list[str] | None:
    """Every path ``patch`` touches (both sides of renames), per git; None when git rejects it."""
    data = patch.encode("utf-8", "surrogateescape")
    fwd, rev = _numstat(data, False), _numstat(data, True)
    if fwd is None or rev is None:
        return None
    return sorted(set(fwd) | set(rev))


def split_patch(patch: str) -> list[tuple[tuple[str, ...], str]] | None:
    """((paths, per git), text) per file diff; None when git's parse and our split disagree
    (then no part of the patch can be attributed to files safely)."""
    chunks = _chunks(patch)
    if not chunks:
        return []
    if len(chunks) > _MAX_FILES:
        return None
    out = []
    for chunk in chunks:
        paths = patch_paths(chunk)
        if not paths:
            return None
        out.append((tuple(paths), chunk))
    return out


def filter_patch(patch: str, protected: Callable[[str], bool]) -> str:
    """``patch`` without the file diffs that touch a protected path; "" when the patch cannot be
    parsed safely or the filtered result (re-parsed as a whole) still touches one."""
    parts = split_patch(patch)
    if parts is None:
        return ""
    kept = "".join(text for paths, text in parts if not any(protected(p) for p in paths))
    if not kept:
        return ""
    final = patch_paths(kept)
    if final is None or any(protected(p) for p in final):
        return ""
    return kept


def capture_command(base: str, workdir: str = "/testbed", git_dir: str = BASE_GIT_DIR) -> str:
    """Shell command printing the work tree's diff against commit ``base`` of the read-only bare
    repository at ``git_dir`` (stdout only; non-zero exit when git fails)."""
    q = shlex.quote
    config = " ".join(
        f"-c {c}"
        for c in (
            "core.bare=false",
            "core.hooksPath=/dev/null",
            "core.fsmonitor=false",
            "core.attributesFile=/dev/null",
            "core.excludesFile=/dev/null",
            "core.autocrlf=false",
            "core.safecrlf=false",
            "core.symlinks=true",
            "core.quotePath=true",
            "core.untrackedCache=false",
            "diff.noprefix=false",
            "diff.mnemonicPrefix=false",
            "diff.relative=false",
            "diff.external=",
            "safe.directory=*",
        )
    )
    env = (
        f"GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null GIT_ATTR_NOSYSTEM=1 HOME=/nonexistent "
        f"XDG_CONFIG_HOME=/nonexistent GIT_DIR={q(git_dir)} GIT_WORK_TREE={q(workdir)} "
        "GIT_INDEX_FILE=/tmp/tsl-index GIT_OBJECT_DIRECTORY=/tmp/tsl-objects "
        f"GIT_ALTERNATE_OBJECT_DIRECTORIES={q(git_dir + '/objects')} "
        "GIT_TERMINAL_PROMPT=0 GIT_OPTIONAL_LOCKS=0"
    )
    git = f"env -i PATH=/usr/bin:/bin LC_ALL=C {env} git {config}"
    return (
        f"exec 2>/dev/null; cd {q(workdir)} && mkdir -p /tmp/tsl-objects && "
        f"{git} read-tree {q(base)} && {git} add -A -- . && "
        f"{git} diff --cached --binary --full-index --no-ext-diff --no-textconv --no-color --no-renames "
        f"--src-prefix=a/ --dst-prefix=b/ {q(base)}"
    )
