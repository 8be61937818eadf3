"""POST /v1/completions and /v1/chat/completions, streaming or not; GET /v1/models.

Handlers translate HTTP to engine calls and back. Each prompt x sample is one engine
sequence; deltas of several prompts are merged into one stream. Leaving a stream early (a
client gone) closes the engine iterators, which aborts their requests and frees their blocks;
a client that leaves before a non-streamed answer is ready does the same (`MergedStream.drain`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from litestar import Controller, Request, Response, get, post
from litestar.params import JSONBody
from litestar.response import ServerSentEvent

from nanoserve.api.errors import APIError
from nanoserve.api.merged_stream import MergedStream
from nanoserve.api.response_builders import (
    Choice,
    chat_logprobs,
    completion_logprobs,
    usage,
)
from nanoserve.api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatDelta,
    ChatRequest,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ModelCard,
    ModelList,
    Usage,
    encode,
)
from nanoserve.api.state import ServerState
from nanoserve.api.translate import chat_prompt, check_model, completion_prompts, sampling_params
from nanoserve.runtime.async_engine import RequestStream
from nanoserve.runtime.sampling_params import MAX_TOP_LOGPROBS

DONE = "[DONE]"


def _sse(data: str | bytes) -> dict[str, Any]:
    return {"data": data.decode() if isinstance(data, bytes) else data}


class OpenAIController(Controller):
    path = "/v1"

    @get("/models")
    async def models(self, server: ServerState) -> ModelList:
        engine = server.require_engine().engine
        return ModelList(
            data=[
                ModelCard(
                    id=engine.name,
                    created=int(server.started),
                    max_model_len=engine.config.max_model_len or 0,
                )
            ]
        )

    @post("/completions", status_code=200)
    async def completions(
        self, request: Request, data: JSONBody[CompletionRequest], server: ServerState
    ) -> Response:
        async_engine = server.require_engine()
        engine = async_engine.engine
        check_model(data, engine)
        if data.logprobs is not None and not 0 <= data.logprobs <= MAX_TOP_LOGPROBS:
            raise APIError(400, f"logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="logprobs")
        params = sampling_params(
            data, max_tokens=data.max_tokens, logprobs=data.logprobs, default_max=16
        )
        prompts = completion_prompts(data, engine)
        request_id = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        streams: list[RequestStream] = []
        try:
            for i, (_, ids) in enumerate(prompts):
                streams.append(async_engine.submit(f"{request_id}-{i}", ids, params))
        except BaseException:
            for stream in streams:
                await stream.aclose()
            raise
        merged = MergedStream(streams)
        merged.start()
        n = params.n
        tokenizer = engine.tokenizer
        prompt_tokens = sum(len(ids) for _, ids in prompts)
        echo_text = [
            (text if text is not None else tokenizer.decode(ids)) if data.echo else ""
            for text, ids in prompts
        ]

        if data.stream:
            include_usage = bool(data.stream_options and data.stream_options.include_usage)

            async def events() -> AsyncIterator[dict[str, Any]]:
                completion, cached, echoed = 0, 0, set()
                try:
                    async for prompt_index, delta in merged:
                        index = prompt_index * n + delta.index
                        text = delta.text
                        if data.echo and index not in echoed:
                            echoed.add(index)
                            text = echo_text[prompt_index] + text
                        completion += len(delta.token_ids)
                        cached = max(cached, delta.cached_tokens)
                        logprobs = None
                        if delta.logprobs is not None:
                            logprobs = completion_logprobs(
                                tokenizer,
                                list(delta.token_ids),
                                list(delta.logprobs),
                                list(delta.top_logprobs or ()),
                                0,
                            )
                        if not text and not delta.token_ids and delta.finish_reason is None:
                            continue
                        chunk = CompletionResponse(
                            id=request_id,
                            created=created,
                            model=engine.name,
                            choices=[
                                CompletionChoice(
                                    index=index,
                                    text=text,
                                    logprobs=logprobs,
                                    finish_reason=delta.finish_reason,
                                )
                            ],
                        )
                        yield _sse(encode(chunk))
                    if include_usage:
                        chunk = CompletionResponse(
                            id=request_id,
                            created=created,
                            model=engine.name,
                            choices=[],
                            usage=usage(prompt_tokens, completion, cached),
                        )
                        yield _sse(encode(chunk))
                    yield _sse(DONE)
                finally:
                    await merged.close()

            return ServerSentEvent(events())

        choices = [[Choice() for _ in range(n)] for _ in prompts]
        cached = 0
        for prompt_index, delta in await merged.drain(request):
            choices[prompt_index][delta.index].add(delta)
            cached = max(cached, delta.cached_tokens)
        out = []
        for p, row in enumerate(choices):
            for i, choice in enumerate(row):
                logprobs = None
                if data.logprobs is not None:
                    logprobs = completion_logprobs(
                        tokenizer, choice.token_ids, choice.logprobs, choice.top, len(echo_text[p])
                    )
                out.append(
                    CompletionChoice(
                        index=p * n + i,
                        text=echo_text[p] + choice.text,
                        logprobs=logprobs,
                        finish_reason=choice.finish_reason,
                    )
                )
        completion = sum(len(c.token_ids) for row in choices for c in row)
        return Response(
            CompletionResponse(
                id=request_id,
                created=created,
                model=engine.name,
                choices=out,
                usage=usage(prompt_tokens, completion, cached),
            )
        )

    @post("/chat/completions", status_code=200)
    async def chat(
        self, request: Request, data: JSONBody[ChatRequest], server: ServerState
    ) -> Response:
        async_engine = server.require_engine()
        engine = async_engine.engine
        check_model(data, engine)
        if data.top_logprobs is not None and not 0 <= data.top_logprobs <= MAX_TOP_LOGPROBS:
            raise APIError(
                400, f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}]", param="top_logprobs"
            )
        if data.top_logprobs and not data.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        logprobs = (data.top_logprobs or 0) if data.logprobs else None
        max_tokens = (
            data.max_completion_tokens
            if data.max_completion_tokens is not None
            else data.max_tokens
        )
        prompt_ids = chat_prompt(data, engine)
        # Unset max_tokens: as long as the context allows, and the pool can hold (a pool smaller
        # than max_model_len would otherwise refuse every chat that leaves it unset).
        context = min(engine.config.max_model_len or 0, engine.pool_plan.num_slots)
        default_max = max(1, context - len(prompt_ids))
        params = sampling_params(
            data, max_tokens=max_tokens, logprobs=logprobs, default_max=default_max
        )
        request_id = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        merged = MergedStream([async_engine.submit(request_id, prompt_ids, params)])
        merged.start()
        tokenizer = engine.tokenizer
        n = params.n

        if data.stream:
            include_usage = bool(data.stream_options and data.stream_options.include_usage)

            def chunk(choices: list[ChatChunkChoice], usage: Usage | None = None) -> dict[str, Any]:
                return _sse(
                    encode(
                        ChatCompletionChunk(
                            id=request_id,
                            created=created,
                            model=engine.name,
                            choices=choices,
                            usage=usage,
                        )
                    )
                )

            async def events() -> AsyncIterator[dict[str, Any]]:
                completion, cached = 0, 0
                try:
                    for i in range(n):
                        yield chunk(
                            [
                                ChatChunkChoice(
                                    index=i, delta=ChatDelta(role="assistant", content="")
                                )
                            ]
                        )
                    async for _, delta in merged:
                        completion += len(delta.token_ids)
                        cached = max(cached, delta.cached_tokens)
                        if (
                            not delta.text
                            and delta.finish_reason is None
                            and delta.logprobs is None
                        ):
                            continue
                        lp = None
                        if delta.logprobs is not None:
                            lp = chat_logprobs(
                                tokenizer,
                                list(delta.token_ids),
                                list(delta.logprobs),
                                list(delta.top_logprobs or ()),
                            )
                        yield chunk(
                            [
                                ChatChunkChoice(
                                    index=delta.index,
                                    delta=ChatDelta(content=delta.text)
                                    if delta.text
                                    else ChatDelta(),
                                    logprobs=lp,
                                    finish_reason=delta.finish_reason,
                                )
                            ]
                        )
                    if include_usage:
                        yield chunk([], usage(len(prompt_ids), completion, cached))
                    yield _sse(DONE)
                finally:
                    await merged.close()

            return ServerSentEvent(events())

        choices = [Choice() for _ in range(n)]
        cached = 0
        for _, delta in await merged.drain(request):
            choices[delta.index].add(delta)
            cached = max(cached, delta.cached_tokens)
        return Response(
            ChatCompletionResponse(
                id=request_id,
                created=created,
                model=engine.name,
                choices=[
                    ChatChoice(
                        index=i,
                        message=AssistantMessage(content=c.text),
                        logprobs=chat_logprobs(tokenizer, c.token_ids, c.logprobs, c.top)
                        if logprobs is not None
                        else None,
                        finish_reason=c.finish_reason,
                    )
                    for i, c in enumerate(choices)
                ],
                usage=usage(len(prompt_ids), sum(len(c.token_ids) for c in choices), cached),
            )
        )


__all__ = ["OpenAIController"]
