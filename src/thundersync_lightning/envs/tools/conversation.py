"""The engine side of a tool-calling episode: sampled ids -> calls -> results -> the next tokens.

Per turn: the sampled ids (through the end-of-turn token) are decoded, the parser reads the
calls, each valid call runs its tool's handler in the episode's sandbox, and each result joins
the conversation as a ``tool`` message. The next tokens are
:meth:`~..chat.ChatRenderer.suffix_ids` of those messages: appended after the sampled ids, never
re-tokenizing them (token-exact), with tool output encoded as plain text (it cannot forge
``<tool_call>`` or an end of turn).

A malformed call (not JSON, unknown tool, arguments failing the schema) gets an error message
as its ``tool`` result and counts in :attr:`ToolTurn.invalid`; a tool that fails (raises, or
reports ``ToolResult.error``: a Python tool's exception or deadline) gets ``[tool error] ...`` and
counts in :attr:`ToolTurn.errors` (:attr:`ToolTurn.timeouts`); a turn without a call gets a user
reminder naming the tools. None raises, and none touches the reward: the verdict alone decides it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError
from ..chat import ChatRenderer
from .base import Tool, ToolResult, check_arguments
from .parsers import CallError, get_tool_parser

__all__ = ["ToolConversation", "ToolTurn", "clip_text"]

NO_CALL = "No tool call found. Call one of the tools ({names})."
NO_CALL_SUBMIT = "No tool call found. Call one of the tools ({names}); call submit when you are done."


@dataclass(frozen=True, slots=True)
class ToolTurn:
    """One answered turn: the tokens that follow it, whether the episode ended, and call counts
    (``errors``: calls whose tool failed, ``timeouts`` of them past their deadline; ``first_error``
    the first failure's reason)."""

    observation: tuple[int, ...]
    done: bool
    calls: int
    invalid: int
    errors: int = 0
    timeouts: int = 0
    first_error: str | None = None


def clip_text(text: str, limit: int) -> str:
    """At most ``limit`` characters: the head and the tail, with the count of those cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[len(text) - (limit - head):]}"


class ToolConversation:
    """A conversation with tools, rendered by ``renderer`` and parsed by the parser named ``parser``.

    Args:
        renderer: the model's chat template (token-exact, see :class:`~..chat.ChatRenderer`).
        tools: what the model may call; their schemas go to the template.
        parser: a name in the tool-parser registry (``hermes``).
        max_result_chars: each tool result is clipped to this many characters.
    """

    def __init__(self, renderer: ChatRenderer, tools: Sequence[Tool], parser: str = "hermes",
                 max_result_chars: int = 4096) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names) or not names:
            raise ConfigError(f"ToolConversation: tool names must be unique and non-empty, got {names}")
        self.renderer = renderer
        self.tools = {t.name: t for t in tools}
        self.schemas = [t.schema() for t in tools]
        self.parse = get_tool_parser(parser)
        self.max_result_chars = max_result_chars
        self.messages: list[dict[str, Any]] = []

    def start(self, messages: Sequence[Mapping[str, Any]]) -> tuple[int, ...]:
        """The prompt's ids: ``messages`` (system, user) with the tools, and the generation prompt."""
        self.messages = [dict(m) for m in messages]
        return self.renderer.prompt_ids(self.messages, self.schemas)

    def respond(self, action: Sequence[int], sandbox: Any) -> ToolTurn:
        """Run the calls of one sampled turn and return what follows it."""
        eot = self.renderer.end_of_turn
        ids = list(action)
        closed = eot in ids
        if closed:
            ids = ids[: ids.index(eot)]
        text = self.renderer.decode(ids)
        parsed = self.parse(text)
        valid = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for c in parsed.calls if not isinstance(c, CallError)]
        self.messages.append({"role": "assistant", "content": text, **({"tool_calls": valid} if valid else {})})
        new: list[dict[str, Any]] = []
        invalid = 0
        failures: list[ToolResult] = []
        for call in parsed.calls:
            if isinstance(call, CallError):
                invalid += 1
                new.append(self._tool_message(call.name or "error", f"[invalid tool call] {call.reason}"))
                continue
            tool = self.tools.get(call.name)
            problem = (f"unknown tool {call.name[:60]!r}; the tools are {', '.join(self.tools)}" if tool is None
                       else check_arguments(tool.parameters, call.arguments))
            if problem is not None or tool is None:
                invalid += 1
                new.append(self._tool_message(call.name[:60], f"[invalid tool call] {problem}"))
                continue
            result = _run(tool, sandbox, call.arguments)
            if result.error is not None:
                failures.append(result)
            if result.done:
                return self._turn((), True, len(parsed.calls), invalid, failures)
            new.append(self._tool_message(call.name, result.text))
        if not parsed.calls:
            reminder = NO_CALL_SUBMIT if "submit" in self.tools else NO_CALL
            new.append({"role": "user", "content": reminder.format(names=", ".join(self.tools))})
        suffix = self.renderer.suffix_ids(self.messages, new, self.schemas)
        self.messages.extend(new)
        return self._turn(suffix if closed else (eot, *suffix), False, len(parsed.calls), invalid, failures)

    @staticmethod
    def _turn(observation: tuple[int, ...], done: bool, calls: int, invalid: int,
              failures: Sequence[ToolResult]) -> ToolTurn:
        return ToolTurn(observation, done, calls, invalid, len(failures), sum(f.timed_out for f in failures),
                        failures[0].error if failures else None)

    def _tool_message(self, name: str, text: str) -> dict[str, Any]:
        return {"role": "tool", "name": name, "content": clip_text(text, self.max_result_chars)}


def _run(tool: Tool, sandbox: Any, arguments: Mapping[str, Any]) -> ToolResult:
    """The handler's result; a handler that raises is the tool's failure, told to the model."""
    try:
        return tool.handler(sandbox, arguments)
    except Exception as exc:  # noqa: BLE001 - a tool's failure is an observation, never the run's
        error = f"{tool.name} raised {type(exc).__name__}: {exc}"
        return ToolResult(f"[tool error] {error}", error=error)
