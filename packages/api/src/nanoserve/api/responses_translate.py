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

from msgspec import Struct

from nanoserve.api.errors import APIError
from nanoserve.api.schemas import (
    ChatMessage,
    ChatRequest,
    FunctionCall,
    FunctionDefinition,
    JsonSchemaFormat,
    ResponseFormat,
    Tool,
    ToolCall,
)

TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(Struct, kw_only=True):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    text: dict[str, Any] | None = None  # {"format": {"type": "text" | "json_object" | ...}}
    previous_response_id: str | None = None
    store: bool | None = None  # accepted; nothing is stored either way
    background: bool | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    reasoning: dict[str, Any] | None = None  # {"effort": ...}; "none" turns thinking off
    # extensions, as on the chat route
    seed: int | None = None
    top_k: int | None = None
    stop: str | list[str] | None = None


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
    effort = (request.reasoning or {}).get("effort")
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
    for i, item in enumerate(given):
        kind = item.get("type", "message")
        if kind == "message" or ("role" in item and "type" not in item):
            messages.append(ChatMessage(role=_role(i, item), content=_text(i, item.get("content"))))
        elif kind == "function_call":
            call = ToolCall(
                id=_string(i, item, "call_id"),
                function=FunctionCall(
                    name=_string(i, item, "name"), arguments=_string(i, item, "arguments")
                ),
            )
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant":  # one turn: its text, its calls
                last.tool_calls = [*(last.tool_calls or []), call]
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
        elif kind == "function_call_output":
            output = item.get("output")
            content = output if isinstance(output, str) else _text(i, output)
            messages.append(
                ChatMessage(role="tool", content=content, tool_call_id=_string(i, item, "call_id"))
            )
        elif kind != "reasoning":
            raise APIError(
                400, f"input[{i}]: items of type {kind!r} are not supported", param="input"
            )
    return messages


def _role(i: int, item: dict[str, Any]) -> str:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise APIError(400, f"input[{i}].role {role!r} is not supported", param="input")
    return str(role)


def _text(i: int, content: Any) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise APIError(400, f"input[{i}].content must be text or a list of parts", param="input")
    texts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in TEXT_PARTS:
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise APIError(
                400,
                f"input[{i}]: only text content parts are supported, not {kind!r}",
                param="input",
            )
        texts.append(str(part.get("text", "")))
    return "".join(texts)


def _string(i: int, item: dict[str, Any], key: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise APIError(400, f"input[{i}].{key} must be a string", param="input")
    return value


def _tool(i: int, tool: dict[str, Any]) -> Tool:
    if tool.get("type") != "function":
        raise APIError(
            400, f"tools[{i}].type must be 'function', got {tool.get('type')!r}", param="tools"
        )
    name = tool.get("name")
    if not isinstance(name, str):
        raise APIError(400, f"tools[{i}].name must be a string", param="tools")
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise APIError(400, f"tools[{i}].parameters must be a JSON schema", param="tools")
    return Tool(
        type="function",
        function=FunctionDefinition(
            name=name,
            description=tool.get("description"),
            parameters=parameters,
            strict=tool.get("strict"),
        ),
    )


def _tool_choice(choice: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """The Responses form {"type": "function", "name"} in the chat form."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _format(text: dict[str, Any] | None) -> ResponseFormat | None:
    fmt = (text or {}).get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
        raise APIError(400, "text.format must be an object with a type", param="text")
    if fmt["type"] != "json_schema":
        return ResponseFormat(type=fmt["type"])
    return ResponseFormat(
        type="json_schema",
        json_schema=JsonSchemaFormat(
            name=fmt.get("name"), schema=fmt.get("schema"), strict=fmt.get("strict")
        ),
    )
