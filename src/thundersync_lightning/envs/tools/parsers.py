"""Tool-call parsers: sampled assistant text -> the calls it makes, in a registry by name.

``hermes`` (alias ``qwen``): the format of Hermes, Qwen2.5 and Qwen3 templates, one JSON object
per block, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``. Text inside a
``<think>`` block is reasoning, not a call. A block that is not valid JSON, not an object with a
string ``name`` and object ``arguments``, or left unclosed becomes a :class:`CallError` with the
reason: the episode tells the model and goes on.

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

__all__ = ["ToolCall", "CallError", "ParsedTurn", "ToolParser", "register_tool_parser", "get_tool_parser",
           "tool_parser_names", "parse_hermes"]


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
    """An assistant turn: its text without the call blocks, and its calls in order."""

    content: str
    calls: tuple[ToolCall | CallError, ...]


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


def _call(body: str) -> ToolCall | CallError:
    try:
        obj = json.loads(body)
    except ValueError as exc:
        return CallError(f"the tool call is not valid JSON ({exc})")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return CallError('a tool call must be a JSON object {"name": ..., "arguments": {...}}')
    args = obj.get("arguments", {})
    if isinstance(args, str):  # some models emit the arguments as a JSON string
        try:
            args = json.loads(args)
        except ValueError:
            return CallError("the tool call's arguments are a string that is not JSON", obj["name"])
    if not isinstance(args, dict):
        return CallError("the tool call's arguments must be a JSON object", obj["name"])
    return ToolCall(obj["name"], args)


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
    return ParsedTurn(content, tuple(calls))


register_tool_parser("qwen", parse_hermes)  # the same format
