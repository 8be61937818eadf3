"""One chat answer as the pieces the Responses and Messages APIs speak in: reasoning text,
content text, whole tool calls, and the end.

The chat route streams OpenAI chunks straight from deltas (sse.py); the other two APIs frame
the same answer differently (output items, content blocks), so they read it here, already
split: the reasoning by reasoning.py, the calls by tool_calls.py (a call is whole once its
`</tool_call>` is seen, and comes with its id), or all three by harmony.py (gpt-oss).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from nanoserve.api.chat.engine_inputs import ChatInputs
from nanoserve.api.chat.harmony import harmony_stream
from nanoserve.api.chat.merged_stream import MergedStream
from nanoserve.api.chat.response_builders import Choice, assistant_message
from nanoserve.api.chat.schemas import ToolCall
from nanoserve.api.chat.tool_calls import ToolCallStream, whole_calls


@dataclass(frozen=True, slots=True)
class Piece:
    """Exactly one of these is set."""

    reasoning: str = ""
    text: str = ""
    call: ToolCall | None = None


@dataclass(frozen=True, slots=True)
class End:
    finish_reason: str  # "stop", "tool_calls", "length", "abort"
    stop_reason: str | int | None  # the stop string (or token) that ended it
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class WholeAnswer:
    reasoning: str | None
    text: str | None
    calls: list[ToolCall]
    end: End


async def answer_pieces(inputs: ChatInputs, merged: MergedStream) -> AsyncIterator[Piece | End]:
    """The first sample's answer (these APIs have no `n`), piece by piece, then its End."""
    thinker = inputs.reasoning.splitter()
    parser = ToolCallStream(inputs.tools)
    harmony = harmony_stream(inputs.tools)
    completion, cached = 0, 0
    async for _, delta in merged:
        completion += len(delta.token_ids)
        cached = max(cached, delta.cached_tokens)
        final = delta.finish_reason is not None
        thought, text, calls = "", delta.text, []
        if inputs.reasoning.harmony:  # gpt-oss: its channels give all three
            split = harmony.push(delta.text, final=final)
            thought, text, calls = split.reasoning, split.content, whole_calls(split.calls)
        else:
            if inputs.reasoning.parses:
                thought, text = thinker.push(delta.text, final=final)
            if inputs.tools.parses:
                text, deltas = parser.push(text, final=final)
                calls = whole_calls(deltas)
        if thought:
            yield Piece(reasoning=thought)
        if text:
            yield Piece(text=text)
        for call in calls:
            yield Piece(call=call)
        if delta.finish_reason is not None:
            finish = delta.finish_reason
            if finish == "stop" and (harmony.num_calls or parser.num_calls):
                finish = "tool_calls"
            yield End(finish, delta.stop_reason, len(inputs.prompt_ids), completion, cached)
            return


def whole_answer(inputs: ChatInputs, deltas: list) -> WholeAnswer:
    """A non-streamed answer (the first sample), split as the chat route splits it."""
    choice, cached, stop_reason = Choice(), 0, None
    for _, delta in deltas:
        if delta.index == 0:
            choice.add(delta)
            stop_reason = delta.stop_reason if delta.finish_reason else stop_reason
        cached = max(cached, delta.cached_tokens)
    message, finish = assistant_message(choice, inputs)
    reasoning = message.reasoning_content if isinstance(message.reasoning_content, str) else None
    calls = message.tool_calls if isinstance(message.tool_calls, list) else []
    end = End(finish or "abort", stop_reason, len(inputs.prompt_ids), len(choice.token_ids), cached)
    return WholeAnswer(reasoning, message.content, calls, end)
