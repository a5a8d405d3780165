"""The engine side of a tool-calling episode: sampled ids -> calls -> results -> the next tokens.

Per turn: the sampled ids (through the end-of-turn token) are decoded, the parser reads the
calls, each valid call runs its tool's handler in the episode's sandbox, and each result joins
the conversation as a ``tool`` message. The next tokens are
:meth:`~..chat.ChatRenderer.suffix_ids` of those messages: appended after the sampled ids, never
re-tokenizing them (token-exact), with tool output encoded as plain text (it cannot forge
``<tool_call>`` or an end of turn).

Model output never raises on the host. A malformed call (not JSON, nested too deep, unknown tool,
arguments failing the schema), a handler that raises (a command the sandbox refuses: a NUL byte,
a lone surrogate) and a turn the parser or the template cannot take all become error messages,
counted in :attr:`ToolTurn.invalid`; only :class:`~...core.errors.HostFault` (a fault no action can
cause) leaves :meth:`ToolConversation.respond`. A tool that reports its own failure
(``ToolResult.error``: a Python tool that raised, died or overran its deadline, see
:mod:`.python_tools`) is answered ``[tool error] ...`` and counted in :attr:`ToolTurn.errors`
(:attr:`ToolTurn.timeouts`). Only calls that passed their schema are kept in the assistant message
the template re-renders. A turn without a call gets a user reminder naming the tools (and
``submit`` only where there is one). None of this touches the reward: the verdict alone decides it.

A turn has a budget (:class:`TurnBudget`): at most ``max_calls`` calls run (the rest are
answered together by one error message, without running); no call starts after ``deadline_s``
(a started call is bounded by its sandbox's own timeout); the turn's results together are at most
``max_chars`` characters (each also at most ``max_result_chars``).

A turn that reached its token budget without the end-of-turn token (a truncated action: a served
model would go on generating to ``max_tokens``) is not a well-formed reply: by default none of its
calls runs; one error message answers them all, each counted invalid, so no state the verdict
reads changes (``run_unfinished_turns=True`` runs them as any turn's).

The stored assistant message holds each kept call once: its ``tool_calls``, and as ``content`` the
text without the call blocks (reasoning kept), as an OpenAI-style conversation has it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError, HostFault
from ..chat import ChatRenderer
from .base import Tool, ToolResult, check_arguments
from .parsers import CallError, ParsedTurn, ToolCall, get_tool_parser

__all__ = ["ToolConversation", "ToolTurn", "TurnBudget", "clip_text", "turn_token_cap", "NOTE_TOKENS"]

NOTE_TOKENS = 64  # per message of a turn: a cut note ("[... N characters cut ...]") or an error's words

NO_CALL = "No tool call found. Call one of the tools ({names})."
NO_CALL_SUBMIT = "No tool call found. Call one of the tools ({names}); call submit when you are done."
UNFINISHED = (
    "the turn reached its token limit without its end-of-turn token; calls run only from a turn that ends"
)


@dataclass(frozen=True, slots=True)
class TurnBudget:
    """What one turn may spend: calls run, seconds before the last call starts, result characters.

    The observation of a turn is then at most ``max_calls + 1`` messages of at most ``max_chars``
    characters of results together (plus a cut marker each), plus the template's markup; with
    ``max_tokens`` it is at most that many tokens, whatever the policy wrote: a turn over it is
    answered by one short error message instead, cut to ``max_tokens`` if even that is longer (a
    budget too small for the template's markup). A task source that declares
    ``max_episode_tokens()`` counts ``max_tokens`` per turn."""

    max_calls: int = 8
    # with one command's timeout it stays under the engines' step_timeout_s (STEP_TIMEOUT_S)
    deadline_s: float | None = 30.0
    max_chars: int = 8192
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        problems = [
            f"{name}={getattr(self, name)!r} must be > 0"
            for name in ("max_calls", "max_chars")
            if not getattr(self, name) > 0
        ]
        if self.max_tokens is not None and not self.max_tokens > 0:
            problems.append(f"max_tokens={self.max_tokens!r} must be > 0 or None")
        if self.deadline_s is not None and not self.deadline_s > 0:
            problems.append(f"deadline_s={self.deadline_s!r} must be > 0 or None")
        if problems:
            raise ConfigError("invalid TurnBudget: " + "; ".join(problems))


@dataclass(frozen=True, slots=True)
class ToolTurn:
    """One answered turn: the tokens that follow it, whether the episode ended, and call counts
    (``errors``: calls whose tool reported a failure, ``timeouts`` of them past their deadline;
    ``first_error`` the first one's reason)."""

    observation: tuple[int, ...]
    done: bool
    calls: int
    invalid: int
    errors: int = 0
    timeouts: int = 0
    first_error: str | None = None


def turn_token_cap(
    renderer: ChatRenderer, schemas: Sequence[Mapping[str, Any]], max_chars: int, max_calls: int
) -> int:
    """A turn's observation ``max_tokens``: 1 (the end of turn, when the engine cut the turn) + the
    template's markup of ``max_calls + 1`` tool messages and the generation prompt + ``max_chars``
    + :data:`NOTE_TOKENS` per message. A turn whose text takes at most one token per character fits;
    any other is answered by one over-budget message (:class:`ToolConversation` enforces the cap
    for any tokenizer and any output)."""
    messages = max_calls + 1
    history = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
    markup = len(
        renderer.suffix_ids(history, [{"role": "tool", "name": "tool", "content": ""}] * messages, schemas)
    )
    return 1 + markup + max_chars + NOTE_TOKENS * messages


def clip_text(text: str, limit: int) -> str:
    """At most ``limit`` characters: the head and the tail, with the count of those cut."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    return (
        f"{text[:head]}\n[... {len(text) - limit} characters cut ...]\n{text[len(text) - (limit - head) :]}"
    )


class ToolConversation:
    """A conversation with tools, rendered by ``renderer`` and parsed by the parser named ``parser``.

    Args:
        renderer: the model's chat template (token-exact, see :class:`~..chat.ChatRenderer`).
        tools: what the model may call; their schemas go to the template.
        parser: a name in the tool-parser registry (``hermes``).
        max_result_chars: each tool result is clipped to this many characters.
        budget: what one turn may spend (calls, deadline, characters of results).
        run_unfinished_turns: run the calls of a turn that never ended (reached its token budget
            without the end-of-turn token); default: refuse them as invalid.
    """

    def __init__(
        self,
        renderer: ChatRenderer,
        tools: Sequence[Tool],
        parser: str = "hermes",
        max_result_chars: int = 4096,
        budget: TurnBudget | None = None,
        run_unfinished_turns: bool = False,
    ) -> None:
        names = [t.name for t in tools]
        if len(set(names)) != len(names) or not names:
            raise ConfigError(f"ToolConversation: tool names must be unique and non-empty, got {names}")
        self.renderer = renderer
        self.tools = {t.name: t for t in tools}
        self.schemas = [t.schema() for t in tools]
        self.parse = get_tool_parser(parser)
        self.max_result_chars = max_result_chars
        self.budget = budget if budget is not None else TurnBudget()
        self.run_unfinished_turns = run_unfinished_turns
        self.messages: list[dict[str, Any]] = []

    def start(self, messages: Sequence[Mapping[str, Any]]) -> tuple[int, ...]:
        """The prompt's ids: ``messages`` (system, user) with the tools, and the generation prompt."""
        self.messages = [dict(m) for m in messages]
        return self.renderer.prompt_ids(self.messages, self.schemas)

    def read(self, ids: list[int]) -> tuple[str, ParsedTurn]:
        """The turn's text and calls (``ids`` without the end-of-turn token); a turn that cannot be
        decoded or parsed is one invalid call, never an exception."""
        try:
            text = self.renderer.decode(ids)
        except Exception as exc:  # noqa: BLE001 - model output never raises on the host
            return "", ParsedTurn("", (CallError(f"the turn could not be decoded ({_brief(exc)})"),))
        try:
            return text, self.parse(text)
        except HostFault:
            raise
        except Exception as exc:  # noqa: BLE001
            return text, ParsedTurn(text, (CallError(f"the turn could not be parsed ({_brief(exc)})"),))

    def _problem(self, call: ToolCall) -> str | None:
        tool = self.tools.get(call.name)
        if tool is None:
            return f"unknown tool {call.name[:60]!r}; the tools are {', '.join(self.tools)}"
        try:
            return check_arguments(tool.parameters, call.arguments)
        except Exception as exc:  # noqa: BLE001 - a schema check must not end the episode
            return f"the arguments could not be checked ({_brief(exc)})"

    def respond(self, action: Sequence[int], sandbox: Any) -> ToolTurn:
        """Run the calls of one sampled turn and return what follows it."""
        eot = self.renderer.end_of_turn
        ids = list(action)
        closed = eot in ids
        if closed:
            ids = ids[: ids.index(eot)]
        text, parsed = self.read(ids)
        if parsed.calls and not (closed or self.run_unfinished_turns):
            n = len(parsed.calls)
            refused = [_error(f"[invalid tool call] {UNFINISHED} ({n} call(s) not run)")]
            return _turn(self._observe(text, [], refused, closed), False, n, n, ())
        budget = self.budget
        deadline = None if budget.deadline_s is None else time.monotonic() + budget.deadline_s
        left = budget.max_chars
        kept: list[ToolCall] = []
        new: list[dict[str, Any]] = []
        invalid = 0
        failures: list[ToolResult] = []
        calls = parsed.calls[: budget.max_calls]
        for call in calls:
            if isinstance(call, CallError):
                invalid += 1
                reply = (call.name or "error", f"[invalid tool call] {call.reason}")
            elif (problem := self._problem(call)) is not None:
                invalid += 1
                reply = (call.name[:60], f"[invalid tool call] {problem}")
            elif deadline is not None and time.monotonic() >= deadline:
                invalid += 1
                reply = (call.name, f"[not run] the turn's deadline of {budget.deadline_s:g} s has passed")
            else:
                kept.append(call)
                try:
                    result = self.tools[call.name].handler(sandbox, call.arguments)
                except HostFault:
                    raise
                except Exception as exc:  # noqa: BLE001 - e.g. a command the sandbox refuses (NUL byte)
                    invalid += 1
                    reply = (call.name, f"[tool error] {_brief(exc)}")
                else:
                    if result.error is not None:
                        failures.append(result)
                    if result.done:
                        self._add_assistant(text, kept, parsed.message_content)
                        return _turn((), True, len(parsed.calls), invalid, failures)
                    reply = (call.name, result.text)
            content = clip_text(reply[1], max(1, min(self.max_result_chars, left)))
            left -= len(content)
            new.append({"role": "tool", "name": reply[0], "content": content})
        if len(parsed.calls) > len(calls):
            extra = len(parsed.calls) - len(calls)
            invalid += extra
            new.append(_error(f"[not run] {extra} more call(s): at most {budget.max_calls} calls per turn"))
        if not parsed.calls:
            reminder = NO_CALL_SUBMIT if "submit" in self.tools else NO_CALL
            new.append({"role": "user", "content": reminder.format(names=", ".join(self.tools))})
        return _turn(
            self._observe(text, kept, new, closed, parsed.message_content),
            False,
            len(parsed.calls),
            invalid,
            failures,
        )

    def _add_assistant(self, text: str, kept: Sequence[ToolCall], stripped: str | None = None) -> None:
        """The turn as a stored message: kept calls as ``tool_calls`` and, with any, the text without
        its call blocks (``stripped``, the parser's ``message_content``) so each call shows once."""
        valid = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in kept]
        content = stripped if valid and stripped is not None else text
        self.messages.append(
            {"role": "assistant", "content": content, **({"tool_calls": valid} if valid else {})}
        )

    def _observe(
        self,
        text: str,
        kept: Sequence[ToolCall],
        new: list[dict[str, Any]],
        closed: bool,
        stripped: str | None = None,
    ) -> tuple[int, ...]:
        """The tokens after the turn (the end of turn first when the engine cut it). A turn the
        template cannot render is kept without its calls and answered by one error message (so
        later turns render too); a turn over ``max_tokens`` is answered by one error message."""
        eot = self.renderer.end_of_turn
        self._add_assistant(text, kept, stripped)
        try:
            suffix = self.renderer.suffix_ids(self.messages, new, self.schemas)
        except HostFault:
            raise
        except Exception as exc:  # noqa: BLE001 - model output never raises on the host
            self.messages[-1] = {"role": "assistant", "content": text}
            new = [_error(f"[invalid turn] it cannot be rendered ({_brief(exc)})")]
            suffix = self.renderer.suffix_ids(self.messages, new, self.schemas)
        obs = suffix if closed else (eot, *suffix)
        limit = self.budget.max_tokens
        if limit is not None and len(obs) > limit:
            new = [
                _error(
                    f"[over budget] the turn's results take {len(obs)} tokens; at most {limit}: "
                    "make fewer calls or ask for less output"
                )
            ]
            suffix = self.renderer.suffix_ids(self.messages, new, self.schemas)
            obs = (suffix if closed else (eot, *suffix))[:limit]
        self.messages.extend(new)
        return obs


def _error(content: str) -> dict[str, Any]:
    return {"role": "tool", "name": "error", "content": content}


def _brief(exc: BaseException) -> str:
    """``Type: message`` of an exception, at most 200 characters (it goes back to the model)."""
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 200 else text[:197] + "..."


def _turn(
    observation: tuple[int, ...], done: bool, calls: int, invalid: int, failures: Sequence[ToolResult]
) -> ToolTurn:
    return ToolTurn(
        observation,
        done,
        calls,
        invalid,
        len(failures),
        sum(f.timed_out for f in failures),
        failures[0].error if failures else None,
    )
