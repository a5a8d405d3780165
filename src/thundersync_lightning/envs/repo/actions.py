"""The agent's action language (text), parsed into commands for the sandbox.

One action per turn; its first line names the verb:

    bash <command>            run a shell command in /testbed (more lines may follow: a script)
    write <path>              replace the whole file <path> with the lines that follow
    replace <path>            edit <path>: the lines that follow are
                              <<<<<<< SEARCH / old text / ======= / new text / >>>>>>> REPLACE
                              (the old text must occur exactly once)
    submit                    end the episode; the tests then decide the reward

Paths are relative to the repository root. Edits run inside the sandbox, as the sandbox's user.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

__all__ = [
    "Bash",
    "WriteFile",
    "ReplaceInFile",
    "Submit",
    "Invalid",
    "Action",
    "parse_action",
    "ACTION_HELP",
    "edit_command",
]

ACTION_HELP = """\
Reply with exactly one action per turn. The first line names it:
  bash <command>        run a shell command in the repository (more lines may follow)
  write <path>          replace the whole file <path> with the lines that follow
  replace <path>        edit <path>; the lines that follow must be
                        <<<<<<< SEARCH
                        old text (must occur exactly once)
                        =======
                        new text
                        >>>>>>> REPLACE
  submit                finish; the hidden tests decide your reward
Paths are relative to the repository root."""


@dataclass(frozen=True, slots=True)
class Bash:
    command: str


@dataclass(frozen=True, slots=True)
class WriteFile:
    path: str
    content: str


@dataclass(frozen=True, slots=True)
class ReplaceInFile:
    path: str
    search: str
    replace: str


@dataclass(frozen=True, slots=True)
class Submit:
    pass


@dataclass(frozen=True, slots=True)
class Invalid:
    reason: str


Action = Bash | WriteFile | ReplaceInFile | Submit | Invalid

_SEARCH, _SEP, _END = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"


def _check_path(path: str) -> str | None:
    if not path:
        return "a path is required"
    if path.startswith("/") or ".." in path.split("/"):
        return f"path {path!r} must be relative to the repository root, without '..'"
    if any(c in path for c in "\0\n"):
        return "path contains a NUL or newline"
    return None


def _parse_replace(body: str) -> tuple[str, str] | str:
    lines = body.split("\n")
    try:
        start = lines.index(_SEARCH)
        sep = lines.index(_SEP, start + 1)
        end = lines.index(_END, sep + 1)
    except ValueError:
        return f"replace needs the lines {_SEARCH!r}, {_SEP!r} and {_END!r}, in that order"
    return "\n".join(lines[start + 1 : sep]), "\n".join(lines[sep + 1 : end])


def parse_action(text: str) -> Action:
    """Parse one action; anything unparseable becomes :class:`Invalid` with the reason."""
    text = text.lstrip()
    if not text:
        return Invalid("empty action")
    first, _, rest = text.partition("\n")
    verb, _, arg = first.strip().partition(" ")
    arg = arg.strip()
    if verb == "submit":
        if arg or rest.strip():
            return Invalid("submit takes no arguments")
        return Submit()
    if verb == "bash":
        command = "\n".join(p for p in (arg, rest) if p).strip()
        return Bash(command) if command else Invalid("bash needs a command")
    if verb in ("write", "replace"):
        problem = _check_path(arg)
        if problem:
            return Invalid(f"{verb}: {problem}")
        if verb == "write":
            return WriteFile(arg, rest)
        parsed = _parse_replace(rest)
        if isinstance(parsed, str):
            return Invalid(parsed)
        if not parsed[0]:
            return Invalid("replace: the SEARCH text is empty")
        return ReplaceInFile(arg, *parsed)
    return Invalid(
        f"unknown action {verb[:40]!r}: the first line must start with bash, write, replace or submit"
    )


_EDIT_SCRIPT = r"""
import json, os, sys
req = json.load(sys.stdin)
path = req["path"]
if req["op"] == "write":
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(req["content"])
    print(f"wrote {path} ({len(req['content'].encode())} bytes)")
else:
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        print(f"cannot read {path}: {e.strerror}"); sys.exit(1)
    n = text.count(req["search"])
    if n != 1:
        print(f"SEARCH text found {n} times in {path}; it must occur exactly once"); sys.exit(1)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(req["search"], req["replace"], 1))
    print(f"edited {path}")
"""


def edit_command(action: WriteFile | ReplaceInFile, python: str = "python3") -> tuple[str, bytes]:
    """(shell command, stdin) that performs the edit inside the sandbox."""
    if isinstance(action, WriteFile):
        req = {"op": "write", "path": action.path, "content": action.content}
    else:
        req = {"op": "replace", "path": action.path, "search": action.search, "replace": action.replace}
    return f"{python} -c {shlex.quote(_EDIT_SCRIPT)}", json.dumps(req).encode()
