"""POST /v1/responses: OpenAI's Responses API, stateless, on the chat path.

The request becomes a chat request (translate.py) and runs as one; its answer, split
into reasoning, text and calls (chat/answer_pieces.py), becomes output items: a `reasoning` item, a
`message` with one `output_text` part, a `function_call` per call. Streamed, the events come in
OpenAI's order, each with its `sequence_number`: `response.created`, `response.in_progress`;
per item `response.output_item.added`, its content (`response.content_part.added`,
`response.output_text.delta`…, `response.output_text.done`, `response.content_part.done`; or
`response.function_call_arguments.delta`/`.done`), `response.output_item.done`; last
`response.completed`, or `response.incomplete` when `max_output_tokens` cut it.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from litestar import Controller, Request, Response, post
from litestar.di import NamedDependency
from litestar.params import JSONBody
from litestar.response import ServerSentEvent

from nanoserve.api.chat.answer_pieces import (
    End,
    Piece,
    WholeAnswer,
    answer_pieces,
    whole_answer,
)
from nanoserve.api.chat.engine_inputs import ChatInputs, translate_chat
from nanoserve.api.chat.foreign import named_event
from nanoserve.api.chat.merged_stream import MergedStream, submit_chat
from nanoserve.api.chat.schemas import ToolCall, encode
from nanoserve.api.responses.schemas import ResponsesRequest
from nanoserve.api.responses.translate import chat_request
from nanoserve.api.server.admission import admit
from nanoserve.api.server.errors import APIError, error_body
from nanoserve.api.server.state import ServerState
from nanoserve.runtime import EngineDeadError, StreamBehindError

Item = dict[str, Any]


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseHead:
    """What every snapshot of one response repeats: its id, and the request as understood."""

    def __init__(self, request: ResponsesRequest, model: str) -> None:
        self.id = _id("resp")
        self.created_at = int(time.time())
        self.model = model
        self.request = request

    def snapshot(self, status: str, output: list[Item], end: End | None = None) -> Item:
        request = self.request
        body: Item = {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "error": None,
            "incomplete_details": None,
            "instructions": request.instructions,
            "max_output_tokens": request.max_output_tokens,
            "temperature": request.temperature,
            "top_p": request.top_p,
            "tools": request.tools or [],
            "tool_choice": request.tool_choice or "auto",
            "parallel_tool_calls": bool(request.parallel_tool_calls),
            "text": request.text or {"format": {"type": "text"}},
            "previous_response_id": None,
            "store": False,
            "metadata": request.metadata or {},
            "usage": None,
        }
        if end is not None:
            body["usage"] = {
                "input_tokens": end.prompt_tokens,
                "input_tokens_details": {"cached_tokens": end.cached_tokens},
                "output_tokens": end.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": end.prompt_tokens + end.completion_tokens,
            }
            body["status"], body["incomplete_details"], body["error"] = _outcome(end)
        return body


def _outcome(end: End) -> tuple[str, Item | None, Item | None]:
    if end.finish_reason in ("stop", "tool_calls"):
        return "completed", None, None
    if end.finish_reason == "length":
        return "incomplete", {"reason": "max_output_tokens"}, None
    return "failed", None, {"code": "server_error", "message": "the generation was aborted"}


def reasoning_item(item_id: str, text: str | None, status: str = "completed") -> Item:
    content = [] if text is None else [{"type": "reasoning_text", "text": text}]
    return {"type": "reasoning", "id": item_id, "summary": [], "content": content, "status": status}


def text_part(text: str) -> Item:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def message_item(item_id: str, text: str | None, status: str = "completed") -> Item:
    content = [] if text is None else [text_part(text)]
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def call_item(item_id: str, call: ToolCall, arguments: str, status: str = "completed") -> Item:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.function.name,
        "arguments": arguments,
        "status": status,
    }


def output_items(answer: WholeAnswer) -> list[Item]:
    items = []
    if answer.reasoning:  # as streamed: no item for an empty thought
        items.append(reasoning_item(_id("rs"), answer.reasoning))
    if answer.text:
        items.append(message_item(_id("msg"), answer.text))
    items += [call_item(_id("fc"), c, c.function.arguments) for c in answer.calls]
    return items


class ResponseEvents:
    """The streamed events of one response, numbered, with the item open now."""

    def __init__(self, head: ResponseHead) -> None:
        self.head = head
        self.sequence = 0
        self.output: list[Item] = []
        self.open: tuple[str, str, int] | None = None  # (kind, item id, output index)
        self.text = ""

    def event(self, kind: str, **fields: Any) -> dict[str, str]:
        body = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return named_event(kind, encode(body).decode())

    def piece(self, piece: Piece) -> list[dict[str, str]]:
        if piece.call is not None:
            return [*self.close(), *self.call(piece.call)]
        kind = "reasoning" if piece.reasoning else "message"
        out = [] if self.open and self.open[0] == kind else [*self.close(), *self.start(kind)]
        _, item_id, index = self.open  # type: ignore[misc]
        delta = piece.reasoning or piece.text
        self.text += delta
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        if kind == "reasoning":
            return [*out, self.event("response.reasoning_text.delta", **where, delta=delta)]
        return [*out, self.event("response.output_text.delta", **where, delta=delta, logprobs=[])]

    def start(self, kind: str) -> list[dict[str, str]]:
        index = len(self.output)
        item_id = _id("rs" if kind == "reasoning" else "msg")
        make = reasoning_item if kind == "reasoning" else message_item
        self.open, self.text = (kind, item_id, index), ""
        self.output.append(make(item_id, None))
        part = {"type": "reasoning_text", "text": ""} if kind == "reasoning" else text_part("")
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        return [
            self.event(
                "response.output_item.added",
                output_index=index,
                item=make(item_id, None, "in_progress"),
            ),
            self.event("response.content_part.added", **where, part=part),
        ]

    def close(self) -> list[dict[str, str]]:
        if self.open is None:
            return []
        kind, item_id, index = self.open
        self.open = None
        where = {"item_id": item_id, "output_index": index, "content_index": 0}
        if kind == "reasoning":
            item, part = reasoning_item(item_id, self.text), {"type": "reasoning_text"}
            part["text"] = self.text
            done = self.event("response.reasoning_text.done", **where, text=self.text)
        else:
            item, part = message_item(item_id, self.text), text_part(self.text)
            done = self.event("response.output_text.done", **where, text=self.text, logprobs=[])
        self.output[index] = item
        return [
            done,
            self.event("response.content_part.done", **where, part=part),
            self.event("response.output_item.done", output_index=index, item=item),
        ]

    def call(self, call: ToolCall) -> list[dict[str, str]]:
        index, item_id = len(self.output), _id("fc")
        arguments = call.function.arguments
        item = call_item(item_id, call, arguments)
        self.output.append(item)
        where = {"item_id": item_id, "output_index": index}
        return [
            self.event(
                "response.output_item.added",
                output_index=index,
                item=call_item(item_id, call, "", "in_progress"),
            ),
            self.event("response.function_call_arguments.delta", **where, delta=arguments),
            self.event(
                "response.function_call_arguments.done",
                **where,
                arguments=arguments,
                name=call.function.name,
            ),
            self.event("response.output_item.done", output_index=index, item=item),
        ]


async def response_events(
    head: ResponseHead, inputs: ChatInputs, merged: MergedStream
) -> AsyncIterator[dict[str, str]]:
    events = ResponseEvents(head)
    try:  # from the first event: a client gone at any yield closes the request
        yield events.event("response.created", response=head.snapshot("in_progress", []))
        yield events.event("response.in_progress", response=head.snapshot("in_progress", []))
        async for piece in answer_pieces(inputs, merged):
            if isinstance(piece, End):
                for event in events.close():
                    yield event
                final = head.snapshot("completed", events.output, piece)
                kind = {"completed": "response.completed", "incomplete": "response.incomplete"}
                yield events.event(kind.get(final["status"], "response.failed"), response=final)
                return
            for event in events.piece(piece):
                yield event
    except (APIError, EngineDeadError, StreamBehindError) as error:
        status = error.status if isinstance(error, APIError) else 500
        body = error_body(status, getattr(error, "message", str(error))).error
        yield events.event("error", code=body.code, message=body.message, param=body.param)
    finally:
        await merged.close()


class ResponsesController(Controller):
    path = "/v1"
    before_request = staticmethod(admit)

    @post("/responses", status_code=200)
    async def responses(
        self,
        request: Request,
        data: JSONBody[ResponsesRequest],
        server: NamedDependency[ServerState],
    ) -> Response:
        engine = server.require_engine()
        inputs = translate_chat(chat_request(data), engine)
        if inputs.params.n != 1:
            raise APIError(400, "the Responses API answers one sample", param="n")
        head = ResponseHead(data, engine.name)
        merged = await submit_chat(engine, head.id, inputs, server.settings.request_timeout)
        if data.stream:
            return ServerSentEvent(response_events(head, inputs, merged))
        answer = whole_answer(inputs, await merged.drain(request))
        return Response(head.snapshot("completed", output_items(answer), answer.end))
