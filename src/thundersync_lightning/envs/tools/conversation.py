"""The engine side of a tool-calling episode: sampled ids -> calls -> results -> the next tokens.

Per turn: the sampled ids (through the end-of-turn token) are decoded, the parser reads the
calls, each valid call runs its tool's handler in the episode's sandbox, and each result joins
the conversation as a ``tool`` message. The next tokens are
:meth:`~..chat.ChatRenderer.suffix_ids` of those messages: appended after the sampled ids, never
re-tokenizing them (token-exact), with tool output encoded as plain text (it cannot forge
``<tool_call>`` or an end of turn).

A malformed call (not JSON, unknown tool, arguments failing the schema) gets an error message
as its ``tool`` result and counts in :attr:`ToolTurn.invalid`; a turn without a call gets a user
reminder. Neither raises, and neither touches the reward: the verdict alone decides it.

A turn that reached its token budget without the end-of-turn token (a truncated action: a served
model would go on generating to ``max_tokens``) is not a well-formed reply: by default its calls are
not run, each answered as invalid ("the turn did not end"), so no state the verdict reads changes
(``run_unfinished_turns=True`` runs them as before).

The stored assistant message holds each call once: its ``tool_calls``, and as ``content`` the text
without the call blocks (reasoning kept), as an OpenAI-style conversation has it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError
from ..chat import ChatRenderer
from .base import Tool, check_arguments
from .parsers import CallError, get_tool_parser

__all__ = ["ToolConversation", "ToolTurn", "clip_text"]

NO_CALL = "No tool call found. Call one of the tools ({names}); call submit when you are done."
UNFINISHED = ("the turn reached its token limit without its end-of-turn token; calls run only from a turn "
              "that ends")


@dataclass(frozen=True, slots=True)
class ToolTurn:
    """One answered turn: the tokens that follow it, whether the episode ended, and call counts."""

    observation: tuple[int, ...]
    done: bool
    calls: int
    invalid: int


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
        run_unfinished_turns: run the calls of a turn that never ended (reached its token budget
            without the end-of-turn token); default: refuse them as invalid.
    """

    def __init__(self, renderer: ChatRenderer, tools: Sequence[Tool], parser: str = "hermes",
                 max_result_chars: int = 4096, run_unfinished_turns: bool = False) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names) or not names:
            raise ConfigError(f"ToolConversation: tool names must be unique and non-empty, got {names}")
        self.renderer = renderer
        self.tools = {t.name: t for t in tools}
        self.schemas = [t.schema() for t in tools]
        self.parse = get_tool_parser(parser)
        self.max_result_chars = max_result_chars
        self.run_unfinished_turns = run_unfinished_turns
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
        runs = closed or self.run_unfinished_turns
        valid = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                 for c in parsed.calls if not isinstance(c, CallError)] if runs else []
        content = parsed.message_content if valid and parsed.message_content is not None else text
        self.messages.append({"role": "assistant", "content": content, **({"tool_calls": valid} if valid else {})})
        new: list[dict[str, Any]] = []
        invalid = 0
        for call in parsed.calls:
            if not runs:
                invalid += 1
                new.append(self._tool_message((call.name or "error")[:60], f"[invalid tool call] {UNFINISHED}"))
                continue
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
            result = tool.handler(sandbox, call.arguments)
            if result.done:
                return ToolTurn((), True, len(parsed.calls), invalid)
            new.append(self._tool_message(call.name, result.text))
        if not parsed.calls:
            new.append({"role": "user", "content": NO_CALL.format(names=", ".join(self.tools))})
        suffix = self.renderer.suffix_ids(self.messages, new, self.schemas)
        self.messages.extend(new)
        return ToolTurn(suffix if closed else (eot, *suffix), False, len(parsed.calls), invalid)

    def _tool_message(self, name: str, text: str) -> dict[str, Any]:
        return {"role": "tool", "name": name, "content": clip_text(text, self.max_result_chars)}
