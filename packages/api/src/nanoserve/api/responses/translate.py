"""OpenAI's Responses API request, translated onto the chat path (as llama.cpp and Ollama do).

Stateless: nothing is stored, so `previous_response_id` is refused (a 400 naming it) and the
conversation travels in `input` each time. `input` is a string or items: messages (`role`,
`content` as text or `input_text`/`output_text` parts), `function_call` and
`function_call_output` items (earlier calls and their results), and `reasoning` items, which
are dropped (a chat template does not take them back). `instructions` is the system message.
Tools are flat (`{"type": "function", "name", "parameters"}`), `text.format` is
`response_format` by another name, `max_output_tokens` is `max_completion_tokens`.
"""

from __future__ import annotations

from typing import Any

from nanoserve.api.chat.foreign import function_tool
from nanoserve.api.chat.schemas import (
    ChatMessage,
    ChatRequest,
    FunctionCall,
    JsonSchemaFormat,
    ResponseFormat,
    Tool,
    ToolCall,
)
from nanoserve.api.responses.schemas import (
    TEXT_PARTS,
    ContentPart,
    FunctionCallItem,
    FunctionCallOutputItem,
    MessageItem,
    ResponsesRequest,
    TextParam,
    ToolParam,
    input_item,
)
from nanoserve.api.server.errors import APIError


def chat_request(request: ResponsesRequest) -> ChatRequest:
    if request.previous_response_id is not None:
        raise APIError(
            400,
            "previous_response_id is not supported: this server stores no responses; send the"
            " conversation in input",
            param="previous_response_id",
        )
    if request.background:
        raise APIError(400, "background responses are not supported", param="background")
    messages = []
    if request.instructions:
        messages.append(ChatMessage(role="system", content=request.instructions))
    messages += input_messages(request.input)
    kwargs = None
    effort = request.reasoning.effort if request.reasoning is not None else None
    if effort in ("none", "minimal"):
        kwargs = {"enable_thinking": False}
    return ChatRequest(
        model=request.model,
        messages=messages,
        max_completion_tokens=request.max_output_tokens,
        temperature=request.temperature,
        top_p=request.top_p,
        top_k=request.top_k,
        seed=request.seed,
        stop=request.stop,
        stream=request.stream,
        tools=[_tool(i, t) for i, t in enumerate(request.tools or ())] or None,
        tool_choice=_tool_choice(request.tool_choice),
        parallel_tool_calls=request.parallel_tool_calls,
        response_format=_format(request.text),
        chat_template_kwargs=kwargs,
    )


def input_messages(given: str | list[dict[str, Any]]) -> list[ChatMessage]:
    if isinstance(given, str):
        return [ChatMessage(role="user", content=given)]
    if not given:
        raise APIError(400, "input is empty", param="input")
    messages: list[ChatMessage] = []
    for i, raw in enumerate(given):
        item = input_item(i, raw)
        if isinstance(item, MessageItem):
            messages.append(ChatMessage(role=_role(i, item.role), content=_text(i, item.content)))
        elif isinstance(item, FunctionCallItem):
            call = ToolCall(
                id=item.call_id, function=FunctionCall(name=item.name, arguments=item.arguments)
            )
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # one turn: its text, its calls
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif isinstance(item, FunctionCallOutputItem):
            content = _text(i, item.output)
            messages.append(ChatMessage(role="tool", content=content, tool_call_id=item.call_id))
        # reasoning items are dropped: a chat template does not take them back
    return messages


def _role(i: int, role: str) -> str:
    if role not in ("user", "assistant", "system", "developer"):
        raise APIError(400, f"input[{i}].role {role!r} is not supported", param="input")
    return role


def _text(i: int, content: str | list[ContentPart]) -> str:
    if isinstance(content, str):
        return content
    for part in content:
        if part.type not in TEXT_PARTS:
            raise APIError(
                400,
                f"input[{i}]: only text content parts are supported, not {part.type!r}",
                param="input",
            )
    return "".join(part.text for part in content)


def _tool(i: int, tool: ToolParam) -> Tool:
    if tool.type != "function":
        raise APIError(400, f"tools[{i}].type must be 'function', got {tool.type!r}", param="tools")
    if tool.name is None:
        raise APIError(400, f"tools[{i}].name must be a string", param="tools")
    return function_tool(tool.name, tool.description, tool.parameters, strict=tool.strict)


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """The Responses form {"type": "function", "name"} in the chat form."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _format(text: TextParam | None) -> ResponseFormat | None:
    fmt = text.format if text is not None else None
    if fmt is None:
        return None
    if fmt.type != "json_schema":
        return ResponseFormat(type=fmt.type)
    return ResponseFormat(
        type="json_schema",
        json_schema=JsonSchemaFormat(name=fmt.name, schema=fmt.schema, strict=fmt.strict),
    )
