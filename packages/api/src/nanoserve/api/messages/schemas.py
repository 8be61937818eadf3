"""Anthropic's Messages API request as msgspec Structs: what the body may hold, checked as it
is decoded (a wrong type, a missing field or an unknown block is a 400 before any work).

Fields this server does not act on are accepted and ignored, as Anthropic's SDKs send them
(`cache_control`, `citations`, `metadata`, a thinking block's `signature`).
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct, field


class TextBlock(Struct, tag="text", kw_only=True):
    text: str


class ToolUseBlock(Struct, tag="tool_use", kw_only=True):
    """An assistant's earlier call: its arguments an object."""

    id: str
    name: str
    input: dict[str, Any] = field(default_factory=dict)


class ToolResultBlock(Struct, tag="tool_result", kw_only=True):
    """A user's answer to a call: text, or text blocks."""

    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool | None = None


class ThinkingBlock(Struct, tag="thinking", kw_only=True):
    thinking: str = ""


class RedactedThinkingBlock(Struct, tag="redacted_thinking", kw_only=True):
    data: str = ""


Block = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock


class MessageParam(Struct, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolParam(Struct, kw_only=True):
    """A client tool (`custom`); server tools (web search and such) name another type."""

    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str = "custom"


class ToolChoiceParam(Struct, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None  # with type "tool"
    disable_parallel_tool_use: bool | None = None


class ThinkingParam(Struct, kw_only=True):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = None


class MessagesRequest(Struct, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None  # required by Anthropic; /count_tokens has none
    messages: list[MessageParam]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    metadata: dict[str, Any] | None = None
