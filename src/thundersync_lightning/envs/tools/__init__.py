"""Native tool calls: tools (name, JSON schema, sandbox handler), call parsers, the tool conversation."""

from .base import Tool, ToolHandler, ToolResult, check_arguments
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
]
