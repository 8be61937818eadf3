"""harmony.py: gpt-oss's channels split into reasoning, content and calls (exact splits, any
chunking), and on the chat, Responses and Messages routes over a FakeEngine whose prompt asks
for a harmony answer."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.api.chat.harmony import HarmonyStream, speaks_harmony, split_harmony
from nanoserve.api.chat.reasoning import ReasoningPlan
from nanoserve.api.chat.schemas import FunctionDefinition, Tool, ToolCallDelta
from nanoserve.api.chat.tool_calls import plan_tools
from tests.api.chat.answer_routes import on_responses_and_messages
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, sse_chunks

HI = [{"role": "user", "content": "Weather in Paris?"}]
PLAN = plan_tools(
    [Tool(type="function", function=FunctionDefinition(name="get_weather"))], "auto", None
)
NO_TOOLS = plan_tools([], None, None)
THINK = "<|channel|>analysis<|message|>Need the weather tool.<|end|>"
CALL = (
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>'
)
FINAL = "<|start|>assistant<|channel|>final<|message|>It is sunny.<|return|>"
PROMPT = "<|start|>user<|message|>Weather in Paris?<|end|><|start|>assistant"


def calls_of(split: Any) -> list[tuple[str, str]]:
    heads, bodies = split.calls[::2], split.calls[1::2]
    return [(h.function.name, b.function.arguments) for h, b in zip(heads, bodies, strict=True)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (THINK + FINAL, ("Need the weather tool.", "It is sunny.", [])),
        (THINK + CALL, ("Need the weather tool.", "", [("get_weather", '{"city": "Paris"}')])),
        # the recipient before the channel, as harmony also allows
        (
            "<|channel|>analysis<|message|>a<|end|><|start|>assistant to=functions.get_weather"
            "<|channel|>commentary json<|message|>{}<|call|>",
            ("a", "", [("get_weather", "{}")]),
        ),
        # a preamble to the user (commentary, no recipient) is content
        (
            "<|channel|>commentary<|message|>Checking.<|end|>" + FINAL,
            ("", "Checking.It is sunny.", []),
        ),
        ("<|channel|>final<|message|>cut off", ("", "cut off", [])),  # max_tokens mid-message
        ("not harmony at all", ("", "not harmony at all", [])),
        # a function the request did not offer: its body is text
        (
            "<|channel|>commentary to=functions.rm_rf<|message|>{}<|call|>",
            ("", "{}", []),
        ),
    ],
)
def test_split(text: str, expected: tuple[str, str, list[tuple[str, str]]]) -> None:
    split = split_harmony(text, PLAN)
    assert (split.reasoning, split.content, calls_of(split)) == expected


def test_without_tools_a_call_is_text() -> None:
    split = split_harmony(THINK + CALL, NO_TOOLS)
    assert (split.reasoning, split.content, split.calls) == (
        "Need the weather tool.",
        '{"city": "Paris"}',
        [],
    )


def test_the_prompt_decides() -> None:
    assert speaks_harmony(PROMPT) and not speaks_harmony("<|im_start|>assistant\n")
    assert ReasoningPlan.of(False, PROMPT).harmony
    assert not ReasoningPlan.of(True, PROMPT, constrained=True).parses


PIECES = st.lists(st.sampled_from([THINK, CALL, FINAL, "<|channel|>final<|message|>x", "y"]))


@given(PIECES, st.lists(st.integers(1, 9), max_size=30))
def test_any_chunking_gives_the_whole_split(pieces: list[str], cuts: list[int]) -> None:
    """However the stream is cut (markers split anywhere), the pieces add up to the whole
    answer's split."""
    text = "".join(pieces)
    stream, at = HarmonyStream(frozenset({"get_weather"})), 0
    reasoning, content = "", ""
    calls: list[ToolCallDelta] = []
    for size in [*cuts, len(text)]:
        final = at + size >= len(text)
        part = stream.push(text[at : at + size], final=final)
        reasoning, content, calls = (
            reasoning + part.reasoning,
            content + part.content,
            calls + part.calls,
        )
        at += size
        if final:
            break
    whole = split_harmony(text, PLAN)
    assert (reasoning, content) == (whole.reasoning, whole.content)
    assert calls_of(type(whole)(calls=calls)) == calls_of(whole)
    # nothing of a marker leaks, whatever the cuts
    assert not any(m in reasoning + content for m in ("<|", "|>"))


def harmony_engine(reply: str) -> FakeEngine:
    return FakeEngine(replies=(reply,), generation_prompt="<|start|>assistant", max_model_len=4096)


TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


@pytest.mark.anyio
async def test_the_chat_route_returns_reasoning_and_calls_in_openai_fields() -> None:
    async with fake_server(harmony_engine(THINK + CALL)) as (client, _):
        body = (
            await client.post(
                "/v1/chat/completions", json={"messages": HI, "tools": TOOLS, "max_tokens": 500}
            )
        ).json()
        answered = (
            await client.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 500})
        ).json()  # no tools: the same text, the call's body as content
    choice = body["choices"][0]
    message = choice["message"]
    assert choice["finish_reason"] == "tool_calls"
    assert message["reasoning_content"] == "Need the weather tool." == message["reasoning"]
    assert message["content"] is None
    [call] = message["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert answered["choices"][0]["message"]["content"] == '{"city": "Paris"}'


@pytest.mark.anyio
async def test_the_chat_stream_sends_no_marker_and_adds_up() -> None:
    fake = harmony_engine(THINK + FINAL)
    async with fake_server(fake) as (client, _):
        response = await client.post(
            "/v1/chat/completions", json={"messages": HI, "stream": True, "max_tokens": 500}
        )
    deltas = [c["choices"][0]["delta"] for c in sse_chunks(response)]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather tool."
    assert "".join(d.get("content", "") for d in deltas) == "It is sunny."
    assert not any("<|" in d.get("content", "") + d.get("reasoning", "") for d in deltas)


@pytest.mark.anyio
async def test_responses_and_messages_get_the_same_split() -> None:
    response, message = await on_responses_and_messages(lambda: harmony_engine(THINK + CALL))
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "Need the weather tool."
    assert call.type == "function_call" and json.loads(call.arguments) == {"city": "Paris"}
    thinking, use = message.content
    assert thinking.type == "thinking" and thinking.thinking == "Need the weather tool."
    assert use.type == "tool_use" and use.input == {"city": "Paris"}
    assert message.stop_reason == "tool_use"
