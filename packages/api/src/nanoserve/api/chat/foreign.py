"""What the foreign protocols' translations share (Anthropic's Messages and OpenAI's Responses
onto the chat request): a function tool, and a server-sent event by name."""

from __future__ import annotations

from typing import Any

from nanoserve.api.chat.schemas import FunctionDefinition, Tool


def function_tool(
    name: str,
    description: str | None,
    parameters: dict[str, Any] | None,
    *,
    strict: bool | None = None,
) -> Tool:
    """The chat route's function tool for a foreign protocol's tool."""
    return Tool(
        type="function",
        function=FunctionDefinition(
            name=name, description=description, parameters=parameters, strict=strict
        ),
    )


def named_event(kind: str, data: str) -> dict[str, str]:
    """A server-sent event of this type, as the streaming response takes it."""
    return {"event": kind, "data": data}
