"""Streamed answers: OpenAI chunks as server-sent events, `data: {json}` each, `data: [DONE]` last.

Each generator owns its MergedStream: leaving it for any reason (the end, an engine error, a
client gone, which cancels it at its `await`) closes the engine streams, so the requests are
aborted and their blocks freed at once.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from nanoserve.api.chat.engine_inputs import ChatInputs, CompletionInputs
from nanoserve.api.chat.harmony import harmony_stream
from nanoserve.api.chat.merged_stream import MergedStream
from nanoserve.api.chat.response_builders import (
    Answer,
    chat_logprobs,
    completion_logprobs,
    echo_prefixes,
    usage,
)
from nanoserve.api.chat.schemas import (
    ChatChunkChoice,
    ChatDelta,
    CompletionChoice,
    ToolCallDelta,
    encode,
)
from nanoserve.api.chat.tool_calls import ToolCallStream
from nanoserve.api.server.errors import APIError, error_body
from nanoserve.runtime import EngineDeadError, StreamBehindError

DONE = "[DONE]"
Event = dict[str, str]  # what Litestar's ServerSentEvent frames as `data: ...`


def event(data: object) -> Event:
    return {"data": encode(data).decode()}


def error_event(error: APIError | EngineDeadError | StreamBehindError) -> Event:
    """A stream that cannot go on (past --request-timeout, or its engine dead) ends with OpenAI's
    error object as its last event before [DONE]; the `openai` client raises it."""
    if isinstance(error, EngineDeadError):
        return event(error_body(500, str(error), code="engine_dead"))
    if isinstance(error, StreamBehindError):
        return event(error_body(408, str(error), code="client_too_slow"))
    return event(error_body(error.status, error.message, param=error.param, code=error.code))


def completion_events(
    answer: Answer, inputs: CompletionInputs, merged: MergedStream
) -> AsyncIterator[Event]:
    # Echo texts are decoded now, before the first byte: a failure is still an error response.
    return _completion_events(answer, inputs, merged, echo_prefixes(inputs, answer.tokenizer))


async def _completion_events(
    answer: Answer, inputs: CompletionInputs, merged: MergedStream, echo: list[str]
) -> AsyncIterator[Event]:
    n = inputs.params.n
    completion, cached, echoed = 0, 0, set()
    try:
        async for prompt_index, delta in merged:
            index = prompt_index * n + delta.index
            text = delta.text
            if inputs.echo and index not in echoed:  # each choice's first chunk carries it
                echoed.add(index)
                text = echo[prompt_index] + text
            completion += len(delta.token_ids)
            cached = max(cached, delta.cached_tokens)
            logprobs = None
            if delta.logprobs is not None:
                logprobs = completion_logprobs(
                    answer.tokenizer,
                    list(delta.token_ids),
                    list(delta.logprobs),
                    list(delta.top_logprobs or ()),
                    0,
                )
            if not text and not delta.token_ids and delta.finish_reason is None:
                continue  # nothing to say (a stop string's possible prefix held back)
            choice = CompletionChoice(
                index=index, text=text, logprobs=logprobs, finish_reason=delta.finish_reason
            )
            yield event(answer.completion([choice]))
        if inputs.include_usage:
            yield event(answer.completion([], usage(inputs.prompt_tokens, completion, cached)))
    except (APIError, EngineDeadError, StreamBehindError) as error:
        yield error_event(error)
    finally:
        await merged.close()
    yield {"data": DONE}


async def chat_events(
    answer: Answer, inputs: ChatInputs, merged: MergedStream
) -> AsyncIterator[Event]:
    completion, cached = 0, 0
    # Where tools are in play, each choice's text passes through a parser that holds back
    # what may be a call and sends each call as tool-call deltas.
    parsers = [ToolCallStream(inputs.tools) for _ in range(inputs.params.n)]
    # Where the template thinks, its <think> part goes first, as reasoning deltas.
    thinkers = [inputs.reasoning.splitter() for _ in range(inputs.params.n)]
    # A harmony answer (gpt-oss) is split into all three by its channels instead.
    harmonies = [harmony_stream(inputs.tools) for _ in range(inputs.params.n)]
    try:
        for i in range(inputs.params.n):  # OpenAI opens each choice with its role
            role = ChatDelta(role="assistant", content="")
            yield event(answer.chat_chunk([ChatChunkChoice(index=i, delta=role)]))
        async for _, delta in merged:
            completion += len(delta.token_ids)
            cached = max(cached, delta.cached_tokens)
            text, calls, thought = delta.text, None, None
            finish = delta.finish_reason
            if inputs.reasoning.harmony:
                harmony = harmonies[delta.index]
                split = harmony.push(text, final=finish is not None)
                thought, text, calls = split.reasoning or None, split.content, split.calls or None
                if finish == "stop" and harmony.num_calls:
                    finish = "tool_calls"
            elif inputs.reasoning.parses:
                thought, text = thinkers[delta.index].push(text, final=finish is not None)
                thought = thought or None
            if inputs.tools.parses and not inputs.reasoning.harmony:
                parser = parsers[delta.index]
                text, found = parser.push(text, final=finish is not None)
                calls = found or None
                if finish == "stop" and parser.num_calls:
                    finish = "tool_calls"
            if not text and not thought and not calls and finish is None and delta.logprobs is None:
                continue
            logprobs = None
            if delta.logprobs is not None:
                logprobs = chat_logprobs(
                    answer.tokenizer,
                    list(delta.token_ids),
                    list(delta.logprobs),
                    list(delta.top_logprobs or ()),
                )
            # A call's deltas go one to a chunk, as OpenAI sends them; the content and the
            # logprobs go with the first, the finish reason with the last.
            parts: list[list[ToolCallDelta] | None] = [[c] for c in calls] if calls else [None]
            for k, part in enumerate(parts):
                last = k == len(parts) - 1
                choice = ChatChunkChoice(
                    index=delta.index,
                    delta=ChatDelta(
                        content=(text or None) if k == 0 else None,
                        reasoning_content=thought if k == 0 else None,
                        reasoning=thought if k == 0 else None,
                        tool_calls=part,
                    ),
                    logprobs=logprobs if k == 0 else None,
                    finish_reason=finish if last else None,
                )
                yield event(answer.chat_chunk([choice]))
        if inputs.include_usage:
            yield event(answer.chat_chunk([], usage(len(inputs.prompt_ids), completion, cached)))
    except (APIError, EngineDeadError, StreamBehindError) as error:
        yield error_event(error)
    finally:
        await merged.close()
    yield {"data": DONE}
