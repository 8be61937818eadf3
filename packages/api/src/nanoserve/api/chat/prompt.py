"""ChatPrompt: a chat request's conversation rendered by the model's template, and tokenized.

The generating route, its `/render` twin and `/tokenize` all render here, so the ids a render
returns are the ids a generation then prefills. Tool turns are rewritten for a template that
cannot render them (tool_calls.py's Hermes format); vLLM's rendering extensions are honoured:
`add_generation_prompt`, `continue_final_message`, `add_special_tokens`, `chat_template_kwargs`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from nanoserve.api.chat.schemas import ChatMessage, ChatRequest
from nanoserve.api.chat.tool_calls import ToolPlan, default_tool_prompt, wire_call
from nanoserve.api.server.engine_client import EngineClient
from nanoserve.api.server.errors import APIError

# Variables the server sets itself; chat_template_kwargs may not replace them.
RESERVED_TEMPLATE_VARS = frozenset({"messages", "tools", "add_generation_prompt"})


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    text: str  # the template's output
    token_ids: list[int]


def render_chat_prompt(request: ChatRequest, engine: EngineClient, tools: ToolPlan) -> ChatPrompt:
    if not request.messages:
        raise APIError(400, "messages is empty", param="messages")
    native = engine.template_reads_tools  # the template renders tools, calls and results
    messages = [_chat_message(i, m, native) for i, m in enumerate(request.messages)]
    extra = _template_vars(request)
    if tools.parses and native:
        extra["tools"] = tools.tool_dicts()
    elif tools.parses:
        prompt = default_tool_prompt(tools)
        if messages[0]["role"] == "system":
            messages[0] = {**messages[0], "content": f"{messages[0]['content']}\n\n{prompt}"}
        else:
            messages.insert(0, {"role": "system", "content": prompt})
    go_on = request.continue_final_message
    if go_on and request.add_generation_prompt:
        raise APIError(
            400,
            "continue_final_message and add_generation_prompt cannot both be true",
            param="continue_final_message",
        )
    text = engine.render_chat(
        messages, add_generation_prompt=request.add_generation_prompt, **extra
    )
    if go_on:
        text = _open_final_message(text, messages[-1]["content"])
    ids = engine.tokenizer.encode(text, add_special_tokens=request.add_special_tokens)
    return ChatPrompt(text=text, token_ids=ids)


def _template_vars(request: ChatRequest) -> dict[str, object]:
    given = dict(request.chat_template_kwargs or {})
    clash = sorted(RESERVED_TEMPLATE_VARS & given.keys())
    if clash:
        raise APIError(
            400,
            f"chat_template_kwargs may not set {', '.join(clash)} (the request's own fields do)",
            param="chat_template_kwargs",
        )
    return given


def _open_final_message(text: str, final: str) -> str:
    """The rendered text cut after the last message's content, so the reply continues it (what
    the template closes the message with, an end-of-turn token, is dropped)."""
    final = final.strip()  # as transformers: a template may trim the content
    at = text.rfind(final)
    if at < 0:
        raise APIError(
            400,
            "continue_final_message: the chat template does not write the last message's text"
            " as sent, so it cannot be continued",
            param="continue_final_message",
        )
    return text[: at + len(final)]


def _chat_message(i: int, message: ChatMessage, native: bool) -> dict[str, Any]:
    """One message as the chat template reads it (tool turns rewritten where it cannot)."""
    if message.role not in ("system", "user", "assistant", "developer", "tool"):
        raise APIError(
            400, f"messages[{i}].role {message.role!r} is not supported", param="messages"
        )
    content = message.content
    if isinstance(content, list):
        texts = []
        for part in content:
            if part.type != "text" or part.text is None:
                raise APIError(
                    400, f"messages[{i}]: only text content parts are supported", param="messages"
                )
            texts.append(part.text)
        content = "".join(texts)
    content = content or ""
    if message.role == "tool":
        if not message.tool_call_id:
            raise APIError(
                400, f"messages[{i}]: a tool message needs tool_call_id", param="messages"
            )
        if native:
            return {"role": "tool", "content": content, "tool_call_id": message.tool_call_id}
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}
    if message.tool_calls:
        if message.role != "assistant":
            raise APIError(
                400, f"messages[{i}]: only assistant messages carry tool_calls", param="messages"
            )
        if native:
            calls = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": _arguments(c.function.arguments),
                    },
                }
                for c in message.tool_calls
            ]
            return {"role": "assistant", "content": content, "tool_calls": calls}
        written = "\n".join(
            wire_call(c.function.name, c.function.arguments) for c in message.tool_calls
        )
        return {"role": "assistant", "content": f"{content}\n{written}" if content else written}
    role = "system" if message.role == "developer" else message.role
    return {"role": role, "content": content}


def _arguments(text: str) -> Any:
    """Templates index arguments as a mapping (Hugging Face's convention); JSON text that is
    not an object is passed on as sent."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict) else text
