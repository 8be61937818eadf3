"""Anthropic's Messages API request, translated onto the chat path.

`system` (text or text blocks) is the system message; a message's content is text or blocks:
`text`; an assistant's `tool_use` (an earlier call, its `input` an object); a user's
`tool_result` (`tool_use_id`, its content text or text blocks), which becomes a tool message;
`thinking` blocks are dropped (a chat template does not take them back). A last assistant
message of text is a prefill: the reply continues it (`continue_final_message`). Tools are
`{"name", "description", "input_schema"}`; `tool_choice` `auto`/`any`/`tool`/`none` is the chat
route's `auto`/`required`/a named function/`none`; `thinking: {"type": "disabled"}` turns a
thinking template's reasoning off (`enable_thinking: false`).
"""

from __future__ import annotations

import json
from typing import Any

from msgspec import Struct

from nanoserve.api.errors import APIError
from nanoserve.api.schemas import (
    ChatMessage,
    ChatRequest,
    FunctionCall,
    FunctionDefinition,
    Tool,
    ToolCall,
)


class MessagesRequest(Struct, kw_only=True):
    model: str | None = None
    max_tokens: int | None = None  # required by Anthropic; /count_tokens has none
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None


def chat_request(request: MessagesRequest, *, counting: bool = False) -> ChatRequest:
    if request.max_tokens is None and not counting:
        raise APIError(400, "max_tokens: Field required", param="max_tokens")
    messages = []
    if request.system:
        messages.append(ChatMessage(role="system", content=_text("system", request.system)))
    if not request.messages:
        raise APIError(400, "messages: at least one message is required", param="messages")
    for i, message in enumerate(request.messages):
        messages += _messages(i, message)
    choice, parallel = _tool_choice(request.tool_choice)
    thinking = (request.thinking or {}).get("type")
    # Anthropic's prefill: a last assistant message of text is the start of the reply
    last = messages[-1]
    prefill = last.role == "assistant" and not last.tool_calls and bool(last.content)
    return ChatRequest(
        model=request.model,
        messages=messages,
        max_tokens=request.max_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        stop=request.stop_sequences,
        stream=request.stream,
        tools=[_tool(i, t) for i, t in enumerate(request.tools or ())] or None,
        tool_choice=choice,
        parallel_tool_calls=parallel,
        chat_template_kwargs={"enable_thinking": thinking == "enabled"} if thinking else None,
        add_generation_prompt=not prefill,
        continue_final_message=prefill,
    )


def _messages(i: int, message: dict[str, Any]) -> list[ChatMessage]:
    role = message.get("role")
    if role not in ("user", "assistant"):
        raise APIError(400, f"messages.{i}.role must be user or assistant", param="messages")
    content = message.get("content")
    if isinstance(content, str):
        return [ChatMessage(role=role, content=content)]
    if not isinstance(content, list):
        raise APIError(400, f"messages.{i}.content must be text or blocks", param="messages")
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        where = f"messages.{i}.content.{j}"
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            call = FunctionCall(name=_string(where, block, "name"), arguments=arguments)
            calls.append(ToolCall(id=_string(where, block, "id"), function=call))
        elif kind == "tool_result" and role == "user":
            result = block.get("content", "")
            text = result if isinstance(result, str) else _text(where, result)
            call_id = _string(where, block, "tool_use_id")
            results.append(ChatMessage(role="tool", content=text, tool_call_id=call_id))
        elif kind not in ("thinking", "redacted_thinking"):
            raise APIError(
                400,
                f"{where}: {kind!r} blocks are not supported in {role} messages",
                param="messages",
            )
    text = "".join(texts)
    if role == "assistant":
        return [ChatMessage(role="assistant", content=text or None, tool_calls=calls or None)]
    return [*results, *([ChatMessage(role="user", content=text)] if texts or not results else [])]


def _text(where: str, blocks: Any) -> str:
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list) or any(
        not isinstance(b, dict) or b.get("type") != "text" for b in blocks
    ):
        raise APIError(400, f"{where}: only text blocks are supported", param="messages")
    return "".join(str(b.get("text", "")) for b in blocks)


def _string(where: str, block: dict[str, Any], key: str) -> str:
    value = block.get(key)
    if not isinstance(value, str):
        raise APIError(400, f"{where}.{key} must be a string", param="messages")
    return value


def _tool(i: int, tool: dict[str, Any]) -> Tool:
    name = tool.get("name")
    if not isinstance(name, str) or tool.get("type", "custom") != "custom":
        raise APIError(
            400, f"tools.{i}: only custom tools with a name are supported", param="tools"
        )
    schema = tool.get("input_schema")
    if schema is not None and not isinstance(schema, dict):
        raise APIError(400, f"tools.{i}.input_schema must be a JSON schema", param="tools")
    return Tool(
        type="function",
        function=FunctionDefinition(
            name=name, description=tool.get("description"), parameters=schema
        ),
    )


def _tool_choice(choice: dict[str, Any] | None) -> tuple[str | dict[str, Any] | None, bool | None]:
    if choice is None:
        return None, None
    kind = choice.get("type")
    disable = choice.get("disable_parallel_tool_use")
    parallel = None if disable is None else not disable
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    raise APIError(
        400, "tool_choice.type must be auto, any, tool (with a name) or none", param="tool_choice"
    )
