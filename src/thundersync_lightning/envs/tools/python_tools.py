"""Tools by name: a Python function ``module:function`` as a :class:`~.base.Tool`.

    tools:
      - my_tools:calculator                     # schema from type hints and the docstring
      - {function: my_tools:lookup, description: "Find a word.",
         parameters: {type: object, properties: {word: {type: string}}, required: [word]}}

The schema of a bare name is ``transformers.utils.get_json_schema(fn)`` (type hints and a
Google-style docstring with an ``Args:`` section, as for ``apply_chat_template(tools=[fn])``).
Explicit ``parameters`` are checked against JSON Schema's meta-schema (draft 2020-12) and must
describe an object: a schema such as ``{"type": "objekt", "required": "expression"}`` is a
ConfigError at set-up, every problem listed, instead of a tool every call of which is refused.

Each call runs in a worker process with a deadline (:mod:`.workers`): a tool that raises, dies
or overruns ``timeout_s`` answers the model with ``[tool error] ...`` and counts in the step's
``rollout/tool_error_fraction`` / ``rollout/tool_timeout_fraction``; it never stops the run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError
from ...core.user_code import import_object
from .base import Tool, ToolResult
from .workers import tool_workers

__all__ = ["PythonToolHandler", "python_tool", "python_tools", "check_tool_schema"]


@dataclass(frozen=True, slots=True)
class PythonToolHandler:
    """Calls ``path`` (``module:function``) in a worker process; picklable, so it travels to the engine."""

    path: str
    timeout_s: float
    max_chars: int = 65536

    def __call__(self, sandbox: Any, arguments: Mapping[str, Any]) -> ToolResult:
        del sandbox  # a Python tool gets its arguments only
        outcome = tool_workers().call(self.path, arguments, self.timeout_s, self.max_chars)
        if outcome.error is not None:
            return ToolResult(f"[tool error] {outcome.error}", error=outcome.error, timed_out=outcome.timed_out)
        return ToolResult(outcome.text)


def check_tool_schema(parameters: Any, where: str) -> list[str]:
    """Every way ``parameters`` is not a JSON Schema of an object (empty: it is one)."""
    from jsonschema import Draft202012Validator

    if not isinstance(parameters, Mapping):
        return [f"{where}: parameters must be a JSON Schema object, got {type(parameters).__name__}"]
    problems = []
    for err in sorted(Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(dict(parameters)),
                      key=lambda e: list(e.absolute_path)):
        at = "/".join(str(p) for p in err.absolute_path) or "(top)"
        problems.append(f"{where}: parameters/{at}: {err.message}")
    if not problems and parameters.get("type") != "object":
        problems.append(f"{where}: parameters must have type 'object' (the call's arguments are a JSON object), "
                        f"got {parameters.get('type')!r}")
    return problems


def python_tool(spec: str | Mapping[str, Any], timeout_s: float, max_chars: int = 65536) -> Tool:
    """A :class:`Tool` from ``"module:function"`` or ``{function: ..., name?, description?, parameters?}``."""
    fields = {"function": spec} if isinstance(spec, str) else dict(spec)
    path = fields.pop("function", None)
    unknown = sorted(set(fields) - {"name", "description", "parameters"})
    if not isinstance(path, str) or unknown:
        raise ConfigError(f"tool {spec!r}: give 'module:function' or a mapping with 'function' and optionally "
                          f"'name', 'description', 'parameters'{f' (unknown keys: {unknown})' if unknown else ''}")
    fn = import_object(path, "tool")
    if not callable(fn):
        raise ConfigError(f"tool {path!r} is not callable")
    if "parameters" in fields:
        parameters, description = fields["parameters"], fields.get("description", (fn.__doc__ or "").strip())
        problems = check_tool_schema(parameters, f"tool {path!r}")
        if problems:
            raise ConfigError("\n".join(problems))
    else:
        parameters, description = _schema_of(fn, path)
        description = fields.get("description", description)
    name = fields.get("name", path.rpartition(":")[2])
    return Tool(str(name), str(description), dict(parameters), PythonToolHandler(path, timeout_s, max_chars))


def _schema_of(fn: Any, path: str) -> tuple[dict[str, Any], str]:
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)["function"]
    except Exception as exc:  # noqa: BLE001 - transformers raises its own parsing exceptions
        raise ConfigError(
            f"tool {path!r}: no JSON schema from its signature ({type(exc).__name__}: {exc}).\n  Fix: give every "
            "argument a type hint and describe it under 'Args:' in a Google-style docstring, or write the schema: "
            f"{{function: {path}, parameters: {{type: object, properties: {{...}}}}}}"
        ) from None
    return dict(schema.get("parameters", {"type": "object", "properties": {}})), str(schema.get("description", ""))


def python_tools(specs: Sequence[str | Mapping[str, Any]], timeout_s: float, max_chars: int = 65536) -> list[Tool]:
    """Every tool of ``specs``; the problems of all of them in one ConfigError, names unique."""
    tools, problems = [], []
    for spec in specs:
        try:
            tools.append(python_tool(spec, timeout_s, max_chars))
        except ConfigError as exc:
            problems.append(str(exc))
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        problems.append(f"tool names must be unique, {dup} repeat (set 'name' in the tool's mapping)")
    if problems:
        raise ConfigError("\n".join(problems))
    return tools
