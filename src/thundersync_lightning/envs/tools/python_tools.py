"""Tools by name: a Python function ``module:function`` as a :class:`~.base.Tool`.

    tools:
      - my_tools:calculator                     # schema from type hints and the docstring
      - {function: my_tools:lookup, description: "Find a word.",
         parameters: {type: object, properties: {word: {type: string}}, required: [word]}}

In Python a tool is also the function itself, as TRL takes it (``tools=[calculator]``): a worker
imports it by the name it is bound to in its module (:func:`.workers.worker_path`); one no worker
can import (a lambda, a closure, a function defined in ``__main__``) runs in a thread of the
engine's process with the same deadline (:class:`InThreadToolHandler`: past it the call is
abandoned, a thread cannot be stopped).

The schema of a bare name is ``transformers.utils.get_json_schema(fn)`` (type hints and a
Google-style docstring with an ``Args:`` section, as for ``apply_chat_template(tools=[fn])``).
Explicit ``parameters`` are checked against JSON Schema's meta-schema (draft 2020-12) and must
describe an object: a schema such as ``{"type": "objekt", "required": "expression"}`` is a
ConfigError at set-up, every problem listed, instead of a tool every call of which is refused.

Each call runs in a worker process of its episode's own pool, confined and with a deadline
(:mod:`.workers`, :mod:`.confine`): the handler's context is that pool (a
:class:`~.workers.ToolWorkers` the episode creates and closes). A tool that raises, dies or
overruns ``timeout_s`` answers the model with ``[tool error] ...`` and counts in the step's
``rollout/tool_error_fraction`` / ``rollout/tool_timeout_fraction``; it never stops the run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.errors import ConfigError
from ...core.user_code import import_object
from .base import Tool, ToolResult
from .workers import ToolWorkers, worker_path

__all__ = [
    "PythonToolHandler",
    "InThreadToolHandler",
    "python_tool",
    "python_tools",
    "check_tool_schema",
    "schema_of",
]


@dataclass(frozen=True, slots=True)
class PythonToolHandler:
    """Calls ``path`` (``module:function``) in a worker of the episode's pool, the handler's
    context; picklable, so it travels to the engine."""

    path: str
    timeout_s: float
    max_chars: int = 65536

    def __call__(self, workers: Any, arguments: Mapping[str, Any]) -> ToolResult:
        if not isinstance(
            workers, ToolWorkers
        ):  # a pool shared beyond the episode would carry its changes on
            raise TypeError(
                f"a Python tool runs in its episode's own ToolWorkers, given as the handler's context; "
                f"got {type(workers).__name__}"
            )
        outcome = workers.call(self.path, arguments, self.timeout_s, self.max_chars)
        if outcome.error is not None:
            return ToolResult(
                f"[tool error] {outcome.error}", error=outcome.error, timed_out=outcome.timed_out
            )
        return ToolResult(outcome.text)


@dataclass(frozen=True, slots=True)
class InThreadToolHandler:
    """Calls ``fn`` (a function no worker can import) in a daemon thread; past ``timeout_s`` the call
    is abandoned and answers as a timeout (the thread runs on: a thread cannot be stopped)."""

    fn: Callable[..., Any]
    timeout_s: float
    max_chars: int = 65536

    def __call__(self, sandbox: Any, arguments: Mapping[str, Any]) -> ToolResult:
        del sandbox
        name = getattr(self.fn, "__name__", "tool")
        box: list[tuple[str, Any]] = []

        def run() -> None:
            try:
                box.append(("ok", self.fn(**arguments)))
            except BaseException as exc:  # noqa: BLE001 - the tool's failure is the model's observation
                box.append(("error", f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__))

        thread = threading.Thread(target=run, name=f"tool-{name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if not box:
            error = f"{name} did not return within {self.timeout_s:g} s and was abandoned"
            return ToolResult(f"[tool error] {error}", error=error, timed_out=True)
        status, value = box[0]
        if status == "error":
            error = f"{name} raised {value}"[: self.max_chars]
            return ToolResult(f"[tool error] {error}", error=error)
        return ToolResult((value if isinstance(value, str) else _json_text(value))[: self.max_chars])


def _json_text(value: Any) -> str:
    import json

    try:
        return json.dumps(value, default=str)
    except (TypeError, ValueError):
        return str(value)


def check_tool_schema(parameters: Any, where: str) -> list[str]:
    """Every way ``parameters`` is not a JSON Schema of an object (empty: it is one)."""
    from jsonschema import Draft202012Validator

    if not isinstance(parameters, Mapping):
        return [f"{where}: parameters must be a JSON Schema object, got {type(parameters).__name__}"]
    problems = []
    for err in sorted(
        Draft202012Validator(Draft202012Validator.META_SCHEMA).iter_errors(dict(parameters)),
        key=lambda e: list(e.absolute_path),
    ):
        at = "/".join(str(p) for p in err.absolute_path) or "(top)"
        problems.append(f"{where}: parameters/{at}: {err.message}")
    if not problems and parameters.get("type") != "object":
        problems.append(
            f"{where}: parameters must have type 'object' (the call's arguments are a JSON object), "
            f"got {parameters.get('type')!r}"
        )
    return problems


def python_tool(
    spec: str | Mapping[str, Any] | Callable[..., Any], timeout_s: float, max_chars: int = 65536
) -> Tool:
    """A :class:`Tool` from ``"module:function"``, ``{function: ..., name?, description?, parameters?}``
    or the function itself (its schema from its type hints and docstring)."""
    if callable(spec) and not isinstance(spec, (str, Mapping)):
        return _function_tool(spec, timeout_s, max_chars)
    fields = {"function": spec} if isinstance(spec, str) else dict(spec) if isinstance(spec, Mapping) else {}
    path = fields.pop("function", None)
    unknown = sorted(set(fields) - {"name", "description", "parameters"})
    if not isinstance(path, str) or unknown:
        raise ConfigError(
            f"tool {spec!r}: give a function, 'module:function' or a mapping with 'function' and optionally "
            f"'name', 'description', 'parameters'{f' (unknown keys: {unknown})' if unknown else ''}"
        )
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


def _function_tool(fn: Callable[..., Any], timeout_s: float, max_chars: int) -> Tool:
    """TRL's ``tools=[fn]``: the function object, run in a worker when one can import it."""
    name = getattr(fn, "__name__", None)
    if not isinstance(name, str) or not name.isidentifier():
        raise ConfigError(
            f"tool {fn!r:.80}: a function tool needs a name (a lambda has none); define it with def"
        )
    parameters, description = _schema_of(fn, name)
    path = worker_path(fn)
    handler: Any = (
        PythonToolHandler(path, timeout_s, max_chars)
        if path is not None
        else InThreadToolHandler(fn, timeout_s, max_chars)
    )
    return Tool(name, description, parameters, handler)


def schema_of(fn: Any, where: str) -> tuple[dict[str, Any], str]:
    """``fn``'s parameters schema and description (``transformers.utils.get_json_schema``); ConfigError
    naming ``where`` when its hints or docstring do not give one."""
    return _schema_of(fn, where)


def _schema_of(fn: Any, path: str) -> tuple[dict[str, Any], str]:
    from transformers.utils import get_json_schema

    try:
        schema = get_json_schema(fn)["function"]
    except Exception as exc:  # noqa: BLE001 - transformers raises its own parsing exceptions
        raise ConfigError(
            f"tool {path!r}: no JSON schema from its signature ({type(exc).__name__}: {exc}).\n"
            "  Fix: give every argument a type hint and describe it under 'Args:' in a Google-style "
            f"docstring, or write the schema: {{function: {path}, parameters: {{type: "
            f"object, properties: {{...}}}}}}"
        ) from None
    return dict(schema.get("parameters", {"type": "object", "properties": {}})), str(
        schema.get("description", "")
    )


def python_tools(
    specs: Sequence[str | Mapping[str, Any] | Callable[..., Any]], timeout_s: float, max_chars: int = 65536
) -> list[Tool]:
    """Every tool of ``specs``; the problems of all of them in one ConfigError, names unique."""
    tools, problems = [], []
    if isinstance(specs, (str, Mapping)) or callable(specs) or not isinstance(specs, Sequence):
        raise ConfigError(
            f"tools must be a list (of functions, 'module:function' names or mappings), got "
            f"{type(specs).__name__} {specs!r:.80}"
        )
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
