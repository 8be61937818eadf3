"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the chat path.

The request becomes a chat request (translate.py); the answer, split into reasoning,
text and calls (chat/answer_pieces.py), becomes content blocks: `thinking`, `text`, `tool_use` (its
`input` the parsed arguments). Streamed, it is Anthropic's events, each an SSE `event:` line and
its JSON: `message_start`; per block `content_block_start`, `content_block_delta`
(`thinking_delta`, `text_delta`, `input_json_delta`), `content_block_stop`; `message_delta`
with the stop reason and usage; `message_stop`. Errors on these routes are Anthropic's shape,
`{"type": "error", "error": {"type", "message"}}`, with the same statuses as the OpenAI routes.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import msgspec
from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import ServerSentEvent

from nanoserve.api.chat.answer_pieces import End, Piece, answer_pieces, whole_answer
from nanoserve.api.chat.engine_inputs import ChatInputs, check_model, translate_chat
from nanoserve.api.chat.foreign import named_event
from nanoserve.api.chat.merged_stream import MergedStream, submit_chat
from nanoserve.api.chat.prompt import render_chat_prompt
from nanoserve.api.chat.schemas import ToolCall
from nanoserve.api.chat.tool_calls import plan_tools
from nanoserve.api.messages.schemas import MessagesRequest
from nanoserve.api.messages.translate import chat_request
from nanoserve.api.server.admission import admit
from nanoserve.api.server.errors import EXCEPTION_HANDLERS, APIError, error_body
from nanoserve.api.server.state import ServerState
from nanoserve.runtime import EngineDeadError, StreamBehindError

Block = dict[str, Any]
ERROR_TYPES = {  # Anthropic's error `type` for each status
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _anthropic(handler: Callable[[Request, Any], Response]) -> Callable[[Request, Any], Response]:
    """An OpenAI-shaped error handler, its body rewritten in Anthropic's shape."""

    def handle(request: Request, error: Any) -> Response:
        response = handler(request, error)
        openai = msgspec.to_builtins(response.content)
        status = response.status_code or 500
        body = anthropic_error(status, openai["error"]["message"])
        return Response(body, status_code=status, headers=response.headers)

    return handle


ANTHROPIC_HANDLERS = {
    kind: _anthropic(cast(Callable[[Request, Any], Response], handler))
    for kind, handler in EXCEPTION_HANDLERS.items()
}


def stop_reason(end: End) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) in Anthropic's words."""
    if end.finish_reason == "tool_calls":
        return "tool_use", None
    if end.finish_reason == "length":
        return "max_tokens", None
    if end.finish_reason == "stop" and isinstance(end.stop_reason, str):
        return "stop_sequence", end.stop_reason
    return "end_turn", None


def usage(end: End | None, prompt_tokens: int) -> dict[str, int]:
    """Anthropic's: input_tokens are those not read from the (prefix) cache."""
    cached = end.cached_tokens if end else 0
    return {
        "input_tokens": prompt_tokens - cached,
        "output_tokens": end.completion_tokens if end else 0,
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    }


def tool_use(call: ToolCall) -> Block:
    try:
        arguments = json.loads(call.function.arguments)
    except json.JSONDecodeError:
        arguments = {}
    return {"type": "tool_use", "id": call.id, "name": call.function.name, "input": arguments}


def message(
    message_id: str, model: str, content: list[Block], end: End | None, prompt: int
) -> Block:
    reason, sequence = stop_reason(end) if end else (None, None)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage(end, prompt),
    }


def event(kind: str, **fields: Any) -> dict[str, str]:
    return named_event(kind, json.dumps({"type": kind, **fields}, ensure_ascii=False))


async def message_events(
    message_id: str, model: str, inputs: ChatInputs, merged: MergedStream
) -> AsyncIterator[dict[str, str]]:
    prompt = len(inputs.prompt_ids)
    index, open_kind = -1, None
    try:  # from the first event: a client gone at any yield closes the request
        yield event("message_start", message=message(message_id, model, [], None, prompt))
        async for piece in answer_pieces(inputs, merged):
            if isinstance(piece, End):
                if open_kind is not None:
                    yield event("content_block_stop", index=index)
                reason, sequence = stop_reason(piece)
                yield event(
                    "message_delta",
                    delta={"stop_reason": reason, "stop_sequence": sequence},
                    usage=usage(piece, prompt),
                )
                yield event("message_stop")
                return
            kind = _kind(piece)
            if kind != open_kind or kind == "tool_use":
                if open_kind is not None:
                    yield event("content_block_stop", index=index)
                index, open_kind = index + 1, kind
                yield event("content_block_start", index=index, content_block=_start(piece))
            yield event("content_block_delta", index=index, delta=_delta(piece))
    except (APIError, EngineDeadError, StreamBehindError) as error:
        status = error.status if isinstance(error, APIError) else 500
        message_text = error_body(status, getattr(error, "message", str(error))).error.message
        yield event("error", error=anthropic_error(status, message_text)["error"])
    finally:
        await merged.close()


def _kind(piece: Piece) -> str:
    return "tool_use" if piece.call else "thinking" if piece.reasoning else "text"


def _start(piece: Piece) -> Block:
    if piece.call is not None:
        return {**tool_use(piece.call), "input": {}}
    if piece.reasoning:
        return {"type": "thinking", "thinking": "", "signature": ""}
    return {"type": "text", "text": ""}


def _delta(piece: Piece) -> Block:
    if piece.call is not None:
        return {"type": "input_json_delta", "partial_json": piece.call.function.arguments}
    if piece.reasoning:
        return {"type": "thinking_delta", "thinking": piece.reasoning}
    return {"type": "text_delta", "text": piece.text}


class MessagesController(Controller):
    path = "/v1/messages"
    before_request = staticmethod(admit)
    exception_handlers = ANTHROPIC_HANDLERS  # type: ignore[assignment]

    @post("/", status_code=200)
    async def messages(
        self,
        request: Request,
        data: JSONBody[MessagesRequest],
        server: NamedDependency[ServerState],
    ) -> Response:
        engine = server.require_engine()
        inputs = translate_chat(chat_request(data), engine)
        message_id = f"msg_{uuid.uuid4().hex}"
        merged = await submit_chat(engine, message_id, inputs, server.settings.request_timeout)
        if data.stream:
            return ServerSentEvent(message_events(message_id, engine.name, inputs, merged))
        answer = whole_answer(inputs, await merged.drain(request))
        content: list[Block] = []
        if answer.reasoning:  # as streamed: no block for an empty thought
            content.append({"type": "thinking", "thinking": answer.reasoning, "signature": ""})
        if answer.text:
            content.append({"type": "text", "text": answer.text})
        content += [tool_use(c) for c in answer.calls]
        prompt = len(inputs.prompt_ids)
        return Response(message(message_id, engine.name, content, answer.end, prompt))

    @post("/count_tokens", status_code=200)
    async def count_tokens(
        self, data: JSONBody[MessagesRequest], server: NamedDependency[ServerState]
    ) -> dict[str, int]:
        engine = server.require_engine()
        chat = chat_request(data, counting=True)
        check_model(chat, engine)
        tools = plan_tools(chat.tools, chat.tool_choice, chat.parallel_tool_calls)
        return {"input_tokens": len(render_chat_prompt(chat, engine, tools).token_ids)}
