"""A tool: a name, a JSON schema for its arguments, and a handler run in the episode's sandbox.

An environment advertises its tools; :meth:`Tool.schema` is what the chat template receives
(``apply_chat_template(tools=[...])``, the OpenAI function format every tool-capable template
reads). :func:`check_arguments` validates a call's arguments against the whole schema (every
JSON Schema keyword, with ``jsonschema``) when the call is made, before the handler runs; a call
that fails is an invalid call answered with the reason, never run, never an exception.
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
"""(the episode's context, validated arguments) -> result. The context is what the episode owns
and closes: its sandbox or workspace (the sandbox bounds a command's time and output), or for
Python tools by name its own :class:`~.workers.ToolWorkers` (a confined worker with a deadline).
A handler runs in the engine's environment pool: one that never returns fails its episode at the
engine's ``step_timeout_s`` and its thread is set aside (``rollout/agent/env_pool.py``)."""


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call by name with JSON arguments matching ``parameters``."""

    name: str
    description: str
    parameters: Mapping[str, Any]
    handler: ToolHandler = field(compare=False)

    def schema(self) -> dict[str, Any]:
        """The definition passed to the chat template."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }


def check_arguments(schema: Mapping[str, Any], value: Any, where: str = "arguments") -> str | None:
    """The most relevant way ``value`` fails ``schema`` (a readable sentence naming where), or None
    when it conforms.

    Every keyword of JSON Schema (draft 2020-12) is checked, ``format`` included (``jsonschema``'s
    validator: ``maxLength``, ``pattern``, ``minItems``, ``enum``, ``oneOf``, ...). A value that is
    long or deep is named by its type and size, not printed: the sentence goes back to the model."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    validator = Draft202012Validator(dict(schema), format_checker=Draft202012Validator.FORMAT_CHECKER)
    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    at = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error.absolute_path)
    message = error.message
    if len(message) > 200:
        size = f" of {len(error.instance)}" if isinstance(error.instance, (str, list, dict)) else ""
        message = (
            f"the {type(error.instance).__name__}{size} fails {error.validator}: "
            f"{error.validator_value!r:.120}"
        )
    return f"{at}: {message}"
