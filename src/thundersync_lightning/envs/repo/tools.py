"""The tools SWE agents use, for native tool calls: ``bash``, ``str_replace_editor``, ``submit``.

Each handler runs in the episode's workspace (the sandbox: its time, memory and output limits
per call, as for text actions). The editor's commands are those of SWE-agent and the
Anthropic/OpenHands editors:

    view         a file with line numbers (``view_range`` [start, end], end -1: to the end), or a
                 directory's files two levels deep
    create       a new file with ``file_text`` (an existing file is an error)
    str_replace  replace ``old_str`` (must occur exactly once) with ``new_str`` (default "")
    insert       insert ``new_str`` after line ``insert_line`` (0: at the top)
    undo_edit    restore the file as it was before its last edit in this episode

Paths are relative to the repository root or absolute inside it. Undo history lives in the
episode (host side): each edit returns the previous content after a marker line that the
handler strips; an edit whose output was cut by the sandbox's output limit cannot be undone.
"""

from __future__ import annotations

import base64
import json
import shlex
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any, get_args

from ...core.errors import ConfigError
from ..chat import ChatRenderer
from ..codec import TextCodec
from ..tools import Tool, ToolConversation, ToolResult, TurnBudget, get_tool_parser
from ..tools.conversation import NOTE_TOKENS, turn_token_cap
from .episode import MAX_OBSERVATION_BYTES, OBSERVATION_FRAME_BYTES, ActionFormat, format_observation

__all__ = [
    "swe_tools",
    "EDITOR_COMMANDS",
    "tool_renderer",
    "tool_conversation",
    "turn_token_budget",
    "code_episode_tokens",
    "NOTE_TOKENS",
]


EDITOR_COMMANDS = ("view", "create", "str_replace", "insert", "undo_edit")
_MARK = "\x00tsl-undo\x00"

_EDITOR_SCRIPT = r"""
import base64, json, os, sys
req = json.load(sys.stdin)
root = os.path.realpath(os.getcwd())
path = os.path.realpath(os.path.join(root, req["path"]))
shown = os.path.relpath(path, root)
if path != root and not path.startswith(root + os.sep):
    print(f"path {req['path']!r} is outside the repository"); sys.exit(1)
cmd = req["command"]
def read():
    with open(path, encoding="utf-8", errors="surrogateescape") as f:
        return f.read()
def write(text, old):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
    return old
try:
    if cmd == "view":
        if os.path.isdir(path):
            for base, dirs, files in os.walk(path):
                dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x != "__pycache__")
                depth = os.path.relpath(base, path).count(os.sep) + (base != path)
                if depth >= 2:
                    dirs[:] = []
                for name in sorted(files):
                    print(os.path.relpath(os.path.join(base, name), root))
            sys.exit(0)
        lines = read().split("\n")
        view_range = req.get("view_range") or [1, -1]
        if len(view_range) != 2:
            print("view_range must be [start, end]"); sys.exit(1)
        start, end = view_range
        end = len(lines) if end == -1 else end
        if not 1 <= start <= max(end, 1) or end > len(lines):
            print(f"view_range {[start, end]} is outside the file's {len(lines)} lines"); sys.exit(1)
        for i in range(start, end + 1):
            print(f"{i:6}\t{lines[i - 1]}")
        sys.exit(0)
    if cmd == "create":
        if os.path.exists(path):
            print(f"{shown} exists; create makes new files only (use str_replace to edit)"); sys.exit(1)
        old = write(req["file_text"], None)
        print(f"created {shown}")
    elif cmd == "str_replace":
        text = read()
        n = text.count(req["old_str"])
        if n != 1:
            print(f"old_str occurs {n} times in {shown}; it must occur exactly once"); sys.exit(1)
        old = write(text.replace(req["old_str"], req.get("new_str", ""), 1), text)
        print(f"edited {shown}")
    elif cmd == "insert":
        text = read()
        lines = text.split("\n")
        at = req["insert_line"]
        if not 0 <= at <= len(lines):
            print(f"insert_line {at} is outside 0..{len(lines)}"); sys.exit(1)
        new = req["new_str"].split("\n")
        old = write("\n".join(lines[:at] + new + lines[at:]), text)
        print(f"inserted {len(new)} line(s) after line {at} of {shown}")
    elif cmd == "restore":
        if req["content"] is None:
            os.remove(path)
        else:
            write(req["content"], None)
        print(f"restored {shown}")
        sys.exit(0)
    else:
        print(f"unknown command {cmd!r}"); sys.exit(1)
except (OSError, UnicodeError) as e:
    print(f"{cmd} {shown}: {e.strerror if isinstance(e, OSError) else e}"); sys.exit(1)
payload = None if old is None else base64.b64encode(old.encode("utf-8", "surrogateescape")).decode()
print(MARK + json.dumps(payload))
""".replace("MARK", repr(_MARK))

_BASH = {
    "type": "object",
    "properties": {"command": {"type": "string", "description": "the shell command"}},
    "required": ["command"],
    "additionalProperties": False,
}
_EDITOR = {
    "type": "object",
    "properties": {
        "command": {"type": "string", "enum": list(EDITOR_COMMANDS)},
        "path": {"type": "string", "description": "file or directory, relative to the repository root"},
        "file_text": {"type": "string", "description": "create: the new file's content"},
        "old_str": {"type": "string", "description": "str_replace: text that occurs exactly once"},
        "new_str": {"type": "string", "description": "str_replace: the replacement; insert: the lines"},
        "insert_line": {"type": "integer", "minimum": 0, "description": "insert: after this line"},
        "view_range": {"type": "array", "items": {"type": "integer"}, "description": "view: [start, end]"},
    },
    "required": ["command", "path"],
    "additionalProperties": False,
}
_NEEDS = {"create": ("file_text",), "str_replace": ("old_str",), "insert": ("insert_line", "new_str")}


def swe_tools(python: str = "python3", max_output_bytes: int = MAX_OBSERVATION_BYTES) -> list[Tool]:
    """Fresh tools for one episode (the editor's undo history is per episode)."""
    undo: dict[str, list[str | None]] = {}

    def bash(workspace: Any, args: Mapping[str, Any]) -> ToolResult:
        return ToolResult(format_observation(workspace.run(args["command"]), max_output_bytes))

    def run_editor(workspace: Any, req: Mapping[str, Any]) -> tuple[str, bool, str | None | bool]:
        command = f"{python} -I -c {shlex.quote(_EDITOR_SCRIPT)}"
        result = workspace.run(command, stdin=json.dumps(dict(req)).encode())
        text = result.output.decode("utf-8", errors="replace")
        previous: str | None | bool = False  # False: no undo payload came back
        if _MARK in text:
            text, _, tail = text.partition(_MARK)
            try:
                encoded = json.loads(tail.strip())
                previous = (
                    None if encoded is None else base64.b64decode(encoded).decode("utf-8", "surrogateescape")
                )
            except ValueError:
                previous = False
        ok = result.exit_code == 0 and not result.timed_out
        shown = format_observation(replace(result, output=text.encode()), max_output_bytes)
        return shown, ok, previous

    def editor(workspace: Any, args: Mapping[str, Any]) -> ToolResult:
        cmd, path = args["command"], args["path"]
        missing = [k for k in _NEEDS.get(cmd, ()) if k not in args]
        if missing:
            return ToolResult(f"[error] {cmd} needs {', '.join(missing)}")
        if cmd == "undo_edit":
            history = undo.get(path)
            if not history:
                return ToolResult(f"[error] no edit of {path} to undo")
            shown, _, _ = run_editor(
                workspace, {"command": "restore", "path": path, "content": history.pop()}
            )
            return ToolResult(shown)
        shown, ok, previous = run_editor(workspace, args)
        if ok and cmd != "view":
            if previous is False:
                shown += "\n[note] this edit cannot be undone (output limit)"
            else:
                undo.setdefault(path, []).append(previous)  # type: ignore[arg-type]
        return ToolResult(shown)

    def submit(workspace: Any, args: Mapping[str, Any]) -> ToolResult:
        return ToolResult("", done=True)

    return [
        Tool("bash", "Run a shell command in the repository (bounded time and output).", _BASH, bash),
        Tool(
            "str_replace_editor",
            "View, create and edit files: view, create, str_replace, insert, undo_edit.",
            _EDITOR,
            editor,
        ),
        Tool(
            "submit",
            "Finish: the hidden tests decide the reward.",
            {"type": "object", "properties": {}, "additionalProperties": False},
            submit,
        ),
    ]


def tool_renderer(
    owner: str,
    action_format: str,
    tokenizer_path: str | None,
    chat_template: str | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    tool_parser: str = "hermes",
) -> ChatRenderer | None:
    """The chat renderer of a code task source in ``tools`` format (None in ``text`` format).

    Raises ConfigError naming every problem: an unknown format, ``tools`` without a tokenizer
    (the tools reach the model through its chat template), an unknown parser."""
    problems = []
    if action_format not in get_args(ActionFormat):
        problems.append(f"action_format={action_format!r}: must be one of {list(get_args(ActionFormat))}")
    elif action_format == "tools" and not tokenizer_path:
        problems.append(
            "action_format='tools' needs tokenizer_path (a local tokenizer with a chat template that "
            "renders tools, e.g. the pretrained model's directory)"
        )
    try:
        get_tool_parser(tool_parser)
    except ConfigError as exc:
        problems.append(str(exc))
    if problems:
        raise ConfigError(f"{owner}: " + "; ".join(problems))
    if action_format != "tools" or tokenizer_path is None:
        return None
    return ChatRenderer(tokenizer_path, chat_template, template_kwargs)


def turn_token_budget(renderer: ChatRenderer, max_output_bytes: int, max_calls: int | None = None) -> int:
    """Tokens of one turn's observation, at most (its :class:`TurnBudget`'s ``max_tokens``):

        1 (the end of turn, when the engine cut the turn) + the template's markup of ``max_calls + 1``
        tool messages and the generation prompt + ``max_output_bytes`` + ``NOTE_TOKENS`` per message
        (``max_calls``: the default :class:`TurnBudget`'s, what :func:`tool_conversation` uses).

    The results together are at most ``max_output_bytes`` characters plus a cut note each, so the
    turn fits when its text takes at most one token per character (ASCII output through a
    byte-level tokenizer). A turn that takes more (non-ASCII floods: U+FFFD of binary output is 3
    bytes) is answered by one over-budget message: :class:`ToolConversation` enforces the bound
    for any tokenizer and any output."""
    calls = TurnBudget().max_calls if max_calls is None else max_calls  # default: the budget's
    return turn_token_cap(renderer, [t.schema() for t in swe_tools()], max_output_bytes, calls)


def tool_conversation(
    renderer: ChatRenderer,
    tool_parser: str = "hermes",
    python: str = "python3",
    max_output_bytes: int = MAX_OBSERVATION_BYTES,
) -> ToolConversation:
    """One episode's conversation over fresh :func:`swe_tools`; a turn's results together are at
    most ``max_output_bytes`` characters (the task's observation limit per turn), at most 8 calls,
    and at most :func:`turn_token_budget` tokens."""
    budget = TurnBudget(max_chars=max_output_bytes, max_tokens=turn_token_budget(renderer, max_output_bytes))
    return ToolConversation(
        renderer,
        swe_tools(python, max_output_bytes),
        tool_parser,
        max_result_chars=max_output_bytes,
        budget=budget,
    )


def code_episode_tokens(
    prompts: Iterable[str],
    *,
    max_turns: int,
    max_action_tokens: int,
    max_observation_bytes: int,
    codec: TextCodec | None,
    renderer: ChatRenderer | None,
) -> int:
    """``max_episode_tokens()`` of a code task source: the longest prompt, then per turn an action of
    at most ``max_action_tokens`` and an observation of at most (text format)
    ``max_observation_bytes + OBSERVATION_FRAME_BYTES`` ids (:class:`~.episode.CodeEnv` cuts there) or
    (tools format) :func:`turn_token_budget` tokens (:class:`ToolConversation` cuts there).

    A prompt is the codec's ids of its text, or (tools) the template's rendering with the tools;
    a bound against any policy, since neither cut depends on what the model writes."""
    if renderer is None:
        if codec is None:
            raise ConfigError("code_episode_tokens: the text format needs a codec")
        prompt = max((len(codec.encode(p)) for p in prompts), default=0)
        observation = max_observation_bytes + OBSERVATION_FRAME_BYTES
    else:
        schemas = [t.schema() for t in swe_tools()]
        prompt = max(
            (len(renderer.prompt_ids([{"role": "user", "content": p}], schemas)) for p in prompts), default=0
        )
        observation = turn_token_budget(renderer, max_output_bytes=max_observation_bytes)
    return prompt + max_turns * (max_action_tokens + observation)
