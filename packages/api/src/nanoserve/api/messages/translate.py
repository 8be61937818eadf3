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

from nanoserve.api.chat.foreign import function_tool
from nanoserve.api.chat.schemas import (
    ChatMessage,
    ChatRequest,
    FunctionCall,
    Tool,
    ToolCall,
)
from nanoserve.api.messages.schemas import (
    MessageParam,
    MessagesRequest,
    TextBlock,
    ToolChoiceParam,
    ToolParam,
    ToolResultBlock,
    ToolUseBlock,
)
from nanoserve.api.server.errors import APIError


def chat_request(request: MessagesRequest, *, counting: bool = False) -> ChatRequest:
    if request.max_tokens is None and not counting:
        raise APIError(400, "max_tokens: Field required", param="max_tokens")
    messages = []
    if request.system:
        messages.append(ChatMessage(role="system", content=_text(request.system)))
    if not request.messages:
        raise APIError(400, "messages: at least one message is required", param="messages")
    for i, message in enumerate(request.messages):
        messages += _messages(i, message)
    choice, parallel = _tool_choice(request.tool_choice)
    thinking = request.thinking.type if request.thinking is not None else None
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


def _messages(i: int, message: MessageParam) -> list[ChatMessage]:
    role, content = message.role, message.content
    if isinstance(content, str):
        return [ChatMessage(role=role, content=content)]
    texts, calls, results = [], [], []
    for j, block in enumerate(content):
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock) and role == "assistant":
            arguments = json.dumps(block.input, ensure_ascii=False)
            call = FunctionCall(name=block.name, arguments=arguments)
            calls.append(ToolCall(id=block.id, function=call))
        elif isinstance(block, ToolResultBlock) and role == "user":
            text = _text(block.content)
            results.append(ChatMessage(role="tool", content=text, tool_call_id=block.tool_use_id))
        elif isinstance(block, ToolUseBlock | ToolResultBlock):
            kind = "tool_use" if isinstance(block, ToolUseBlock) else "tool_result"
            raise APIError(
                400,
                f"messages.{i}.content.{j}: {kind!r} blocks are not supported in {role} messages",
                param="messages",
            )
        # thinking blocks are dropped: a chat template does not take them back
    text = "".join(texts)
    if role == "assistant":
        return [ChatMessage(role="assistant", content=text or None, tool_calls=calls or None)]
    return [*results, *([ChatMessage(role="user", content=text)] if texts or not results else [])]


def _text(blocks: str | list[TextBlock]) -> str:
    return blocks if isinstance(blocks, str) else "".join(b.text for b in blocks)


def _tool(i: int, tool: ToolParam) -> Tool:
    if tool.type != "custom":
        raise APIError(
            400, f"tools.{i}: only custom tools with a name are supported", param="tools"
        )
    return function_tool(tool.name, tool.description, tool.input_schema)


def _tool_choice(
    choice: ToolChoiceParam | None,
) -> tuple[str | dict[str, Any] | None, bool | None]:
    if choice is None:
        return None, None
    disable = choice.disable_parallel_tool_use
    parallel = None if disable is None else not disable
    if choice.type == "tool":
        if choice.name is None:
            raise APIError(400, "tool_choice: type tool needs a name", param="tool_choice")
        return {"type": "function", "function": {"name": choice.name}}, parallel
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type], parallel
