"""Native tool calls: tools (name, JSON schema, handler), call parsers, the tool conversation, and
Python functions as tools (by name, each call in a confined worker process of the episode's own,
with a deadline)."""

from .base import Tool, ToolHandler, ToolResult, check_arguments
from .confine import WorkerLimits
from .conversation import ToolConversation, ToolTurn, TurnBudget, clip_text
from .parsers import (
    CallError,
    ParsedTurn,
    ToolCall,
    ToolParser,
    get_tool_parser,
    parse_hermes,
    register_tool_parser,
    tool_parser_names,
)
from .python_tools import InThreadToolHandler, PythonToolHandler, check_tool_schema, python_tool, python_tools
from .workers import ToolOutcome, ToolWorkers, reward_workers

__all__ = [
    "Tool",
    "ToolHandler",
    "ToolResult",
    "check_arguments",
    "ToolConversation",
    "ToolTurn",
    "TurnBudget",
    "clip_text",
    "CallError",
    "ParsedTurn",
    "ToolCall",
    "ToolParser",
    "get_tool_parser",
    "parse_hermes",
    "register_tool_parser",
    "tool_parser_names",
    "PythonToolHandler",
    "InThreadToolHandler",
    "check_tool_schema",
    "python_tool",
    "python_tools",
    "ToolOutcome",
    "ToolWorkers",
    "WorkerLimits",
    "reward_workers",
]
