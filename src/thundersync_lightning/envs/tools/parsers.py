"""Tool-call parsers: sampled assistant text -> the calls it makes, in a registry by name.

``hermes`` (alias ``qwen``): the format of Hermes, Qwen2.5 and Qwen3 templates, one JSON object
per block, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Text inside a
``<think>`` block is reasoning, not a call. A block that is not valid JSON, not an object with a
string ``name`` and object ``arguments``, or left unclosed becomes a :class:`CallError` with the
reason: the episode tells the model and goes on. So does JSON nested deeper than
:data:`MAX_DEPTH` or holding NaN, an infinity or a number past a double: nothing downstream (the
schema check, the chat template's ``tojson``, a handler) ever recurses over or chokes on a value
the model wrote.

Register another format with :func:`register_tool_parser`; :func:`get_tool_parser` of an
unknown name raises ConfigError with the known names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...core.registry import Registry

__all__ = [
    "ToolCall",
    "CallError",
    "ParsedTurn",
    "ToolParser",
    "register_tool_parser",
    "get_tool_parser",
    "tool_parser_names",
    "parse_hermes",
    "MAX_DEPTH",
    "nesting",
]


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class CallError:
    """A call the parser could not read (``name`` when it got that far)."""

    reason: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ParsedTurn:
    """An assistant turn: its text without the call blocks (and reasoning), and its calls in order.

    ``message_content``: the turn's text without the call blocks, reasoning kept: the ``content`` of
    the assistant message stored beside its ``tool_calls``, so that a template rendering the message
    shows each call once (None: the parser does not say; the whole text is stored)."""

    content: str
    calls: tuple[ToolCall | CallError, ...]
    message_content: str | None = None


ToolParser = Callable[[str], ParsedTurn]

_PARSERS: Registry[ToolParser] = Registry("tool parser", "add one with register_tool_parser")


def register_tool_parser(name: str, fn: ToolParser | None = None, *, overwrite: bool = False) -> Any:
    """Register ``fn`` as ``name``: ``@register_tool_parser(name)`` or ``register_tool_parser(name, fn)``
    (:class:`~thundersync_lightning.core.registry.Registry` rules: a taken name needs ``overwrite=True``)."""
    return _PARSERS.register(name, fn, overwrite=overwrite)


def tool_parser_names() -> tuple[str, ...]:
    return _PARSERS.names()


def get_tool_parser(name: str) -> ToolParser:
    return _PARSERS.get(name)


_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
_BLOCK = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)


MAX_DEPTH = 16  # nesting of a call's JSON; deeper is refused before anything recurses over it


def _not_finite(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{text[:40]} does not fit a double")
    return value


def nesting(text: str) -> int:
    """How deep the brackets of a JSON text nest (strings skipped); no recursion, any length."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _json(text: str) -> Any:
    """``json.loads`` refusing NaN, infinities, numbers past a double and nesting past MAX_DEPTH:
    what a chat template, a schema check or a handler would otherwise trip over (ValueError)."""
    if nesting(text) > MAX_DEPTH:
        raise ValueError(f"it nests deeper than {MAX_DEPTH} levels")
    return json.loads(text, parse_constant=_not_finite, parse_float=_finite)


def _call(body: str) -> ToolCall | CallError:
    try:
        obj = _json(body)
    except (ValueError, RecursionError) as exc:
        return CallError(f"the tool call is not valid JSON ({str(exc)[:200]})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return CallError('a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    name = obj["name"][:200]
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = _json(args)
        except (ValueError, RecursionError):
            return CallError("the tool call's arguments are a string that is not JSON", name)
    if not isinstance(args, dict):
        return CallError("the tool call's arguments must be a JSON object", name)
    return ToolCall(name, args)


@register_tool_parser("hermes")
def parse_hermes(text: str) -> ParsedTurn:
    """``<tool_call>{json}</tool_call>`` blocks outside ``<think>``."""
    visible = _THINK.sub("", text)
    calls: list[ToolCall | CallError] = []
    for m in _BLOCK.finditer(visible):
        if not m.group(2):
            calls.append(CallError("a <tool_call> block is not closed with </tool_call>"))
        else:
            calls.append(_call(m.group(1).strip()))
    content = _BLOCK.sub("", visible).strip()
    kept, start = [], 0  # the text less its call blocks, think blocks (and calls inside them) as written
    for m in _THINK.finditer(text):
        kept += [_BLOCK.sub("", text[start : m.start()]), m.group(0)]
        start = m.end()
    kept.append(_BLOCK.sub("", text[start:]))
    return ParsedTurn(content, tuple(calls), "".join(kept).strip())


register_tool_parser("qwen", parse_hermes)  # the same format
