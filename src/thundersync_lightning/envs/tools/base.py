"""A tool: a name, a JSON schema for its arguments, and a handler run in the episode's sandbox.

An environment advertises its tools; :meth:`Tool.schema` is what the chat template receives
(``apply_chat_template(tools=[...])``, the OpenAI function format every tool-capable template
reads). :func:`check_arguments` validates a call's arguments against the schema before the
handler runs; a failure is an error message to the model, never an exception.

The schema checker covers the JSON Schema keywords tool definitions use: ``type`` (object,
string, integer, number, boolean, array, null, or a list of them), ``properties``, ``required``,
``additionalProperties: false``, ``enum``, ``items``, ``minimum`` / ``maximum``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Tool", "ToolResult", "ToolHandler", "check_arguments"]


@dataclass(frozen=True, slots=True)
class ToolResult:
    """What a handler returns: the text the model sees and whether the episode ends (``submit``);
    ``error`` says why the tool failed (it raised, died or overran its deadline: ``timed_out``)."""

    text: str
    done: bool = False
    error: str | None = None
    timed_out: bool = False


ToolHandler = Callable[[Any, Mapping[str, Any]], ToolResult]
"""(the episode's sandbox or workspace, validated arguments) -> result. It runs in the engine's
environment pool; the sandbox bounds its time and output as for any command."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call by name with JSON arguments matching ``parameters``."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: ToolHandler = field(compare=False)

    def schema(self) -> dict[str, Any]:
        """The definition passed to the chat template."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}}


_TYPES: dict[str, Callable[[Any], bool]] = {
    "object": lambda v: isinstance(v, dict),
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


def check_arguments(schema: Mapping[str, Any], value: Any, where: str = "arguments") -> str | None:
    """The first way ``value`` fails ``schema`` (a readable sentence), or None when it conforms."""
    kind = schema.get("type")
    if kind is not None:
        kinds = [kind] if isinstance(kind, str) else list(kind)
        if not any(_TYPES.get(k, lambda v: True)(value) for k in kinds):
            return f"{where} must be {' or '.join(kinds)}, got {type(value).__name__}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {list(schema['enum'])}, got {value!r}"[:300]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{where} must be >= {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{where} must be <= {schema['maximum']}"
    if isinstance(value, dict):
        props = schema.get("properties", {})
        missing = [k for k in schema.get("required", ()) if k not in value]
        if missing:
            return f"{where} lacks required {', '.join(map(repr, missing))}"
        if schema.get("additionalProperties") is False:
            extra = [k for k in value if k not in props]
            if extra:
                return f"{where} has unknown {', '.join(repr(k)[:60] for k in extra[:5])} (allowed: {sorted(props)})"
        for key, sub in props.items():
            if key in value:
                problem = check_arguments(sub, value[key], f"{where}.{key}")
                if problem:
                    return problem
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problem = check_arguments(schema["items"], item, f"{where}[{i}]")
            if problem:
                return problem
    return None
