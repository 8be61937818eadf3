"""OpenAI's Responses API request as msgspec Structs: what the body may hold, checked as it is
decoded, and each `input` item checked as it is read (`input_item`).

An item may leave out `type` when it has a `role` (the SDKs' "easy" message), which a tagged
union cannot decode, so `input` arrives as objects and each is converted on its own, its
errors naming it (`input[2]: ...`). Fields this server does not act on are accepted and
ignored (an item's `id` and `status`, a reasoning item's summary).
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct

from nanoserve.api.server.errors import APIError

TEXT_PARTS = ("input_text", "output_text", "text")


class ContentPart(Struct, kw_only=True):
    type: str  # one of TEXT_PARTS; images and files are refused
    text: str = ""


class MessageItem(Struct, tag="message", kw_only=True):
    role: str
    content: str | list[ContentPart]


class FunctionCallItem(Struct, tag="function_call", kw_only=True):
    call_id: str
    name: str
    arguments: str


class FunctionCallOutputItem(Struct, tag="function_call_output", kw_only=True):
    call_id: str
    output: str | list[ContentPart]


class ReasoningItem(Struct, tag="reasoning", kw_only=True):
    pass


InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem
ITEM_TYPES = ("message", "function_call", "function_call_output", "reasoning")


def input_item(i: int, item: dict[str, Any]) -> InputItem:
    """The i-th `input` item, typed; a 400 naming it where it is not one this server takes."""
    kind = item.get("type", "message" if "role" in item else None)
    if kind not in ITEM_TYPES:
        raise APIError(400, f"input[{i}]: items of type {kind!r} are not supported", param="input")
    try:
        return msgspec.convert({**item, "type": kind}, InputItem)
    except msgspec.ValidationError as error:
        raise APIError(400, f"input[{i}]: {error}", param="input") from None


class ToolParam(Struct, kw_only=True, omit_defaults=True):
    """A tool, flat: `{"type": "function", "name", "parameters"}`; the hosted tools (web
    search and such) name another type, and are refused."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class TextFormat(Struct, kw_only=True, omit_defaults=True):
    """`response_format` by another name: text, json_object, or json_schema (flat)."""

    type: str
    name: str | None = None
    schema: dict[str, Any] | bool | None = None
    strict: bool | None = None
    description: str | None = None


class TextParam(Struct, kw_only=True, omit_defaults=True):
    format: TextFormat | None = None


class ReasoningParam(Struct, kw_only=True, omit_defaults=True):
    effort: str | None = None  # "none" and "minimal" turn a thinking template's reasoning off
    summary: str | None = None


class ResponsesRequest(Struct, kw_only=True):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[ToolParam] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: TextParam | None = None
    previous_response_id: str | None = None
    store: bool | None = None  # accepted; nothing is stored either way
    background: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: ReasoningParam | None = None
    # extensions, as on the chat route
    seed: int | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None
