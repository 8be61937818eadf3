"""gemma4_format.py: Gemma 4's thinking channel and tool calls split into the OpenAI fields
(exact splits, any chunking), its argument syntax read as JSON, the answer decoded with its
marks kept, and the chat, Responses and Messages routes over a FakeEngine whose prompt opens a
Gemma 4 model turn."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.api.chat.gemma4_format import arguments, parse_gemma4_call, speaks_gemma4
from nanoserve.api.chat.reasoning import ReasoningPlan
from nanoserve.api.chat.schemas import FunctionDefinition, Tool
from nanoserve.api.chat.tool_calls import ToolCallStream, parse_tool_calls, plan_tools
from tests.api.chat.answer_routes import on_responses_and_messages
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, sse_chunks

PROMPT = "<bos><|turn>user\nWeather in Paris?<turn|>\n<|turn>model\n"
THINK = "<|channel>thought\nNeed the weather tool.<channel|>"
CALL = '<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|>'
PLAN = plan_tools(
    [Tool(type="function", function=FunctionDefinition(name="get_weather"))], "auto", None
)
GEMMA4_PLAN = type(PLAN)(PLAN.tools, PLAN.choice, PLAN.function, PLAN.parallel, wire="gemma4")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('{city:<|"|>Paris, France<|"|>}', {"city": "Paris, France"}),  # a comma in a string
        ("{n:42,x:-1.5,ok:true,none:null}", {"n": 42, "x": -1.5, "ok": True, "none": None}),
        ('{a:{b:[1,<|"|>two<|"|>,{c:false}]}}', {"a": {"b": [1, "two", {"c": False}]}}),
        ("{ unit : celsius }", {"unit": "celsius"}),  # a bare word is text
        ('{<|"|>odd key<|"|>:1}', {"odd key": 1}),
        ("{}", {}),
    ],
)
def test_its_argument_syntax_reads_as_json(text: str, value: Any) -> None:
    assert arguments(text) == value


@pytest.mark.parametrize("text", ["{a:1", '{a:<|"|>open}', "{a:1}x", "{:1}", "[1 2"])
def test_malformed_arguments_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        arguments(text)


def test_a_call_is_ours_only_by_name_and_shape() -> None:
    names = {"get_weather"}
    call = parse_gemma4_call('call:get_weather{city:<|"|>Paris<|"|>}', names)
    assert call is not None and json.loads(call.arguments) == {"city": "Paris"}
    assert parse_gemma4_call("call:rm_rf{}", names) is None
    assert parse_gemma4_call("call:get_weather[1]", names) is None
    assert parse_gemma4_call("get_weather{}", names) is None


def test_the_prompt_decides() -> None:
    assert speaks_gemma4(PROMPT)
    assert not speaks_gemma4(PROMPT + "Hi<turn|>\n") and not speaks_gemma4("<|im_start|>")
    plan = ReasoningPlan.of(False, PROMPT)
    assert plan.parses and plan.keeps_marks and not plan.starts_inside
    assert ReasoningPlan.of(False, PROMPT + "<|channel>thought\n").starts_inside
    assert not ReasoningPlan.of(True, "<|im_start|>assistant\n").keeps_marks


def split(text: str, cuts: list[int]) -> tuple[str, str, list[tuple[str | None, str | None]]]:
    """The answer streamed in pieces of `cuts`: (reasoning, content, calls)."""
    thinker, parser = ReasoningPlan.of(False, PROMPT).splitter(), ToolCallStream(GEMMA4_PLAN)
    reasoning, content, calls, at = "", "", [], 0
    for size in [*cuts, len(text)]:
        final = at + size >= len(text)
        thought, piece = thinker.push(text[at : at + size], final=final)
        piece, deltas = parser.push(piece, final=final)
        reasoning, content = reasoning + thought, content + piece
        calls += [(d.function.name, d.function.arguments) for d in deltas if d.function]
        at += size
        if final:
            return reasoning, content, calls
    raise AssertionError


def test_the_split() -> None:
    reasoning, content, calls = split(THINK + CALL, [])
    assert (reasoning, content) == ("Need the weather tool.", "")
    assert calls == [("get_weather", ""), (None, '{"city": "Paris", "days": 3}')]
    assert parse_tool_calls("It is sunny." + CALL, GEMMA4_PLAN)[0] == "It is sunny."
    # a Hermes call is text to a Gemma 4 answer, and a Gemma 4 call to a Hermes one
    assert split('<tool_call>{"name": "get_weather"}</tool_call>', [])[2] == []
    assert parse_tool_calls(CALL, PLAN) == (CALL, [])


@given(
    st.booleans(),
    st.lists(st.sampled_from([CALL, "It is sunny.", "<|tool_call>call:rm{}<tool_call|>"])),
    st.lists(st.integers(1, 9), max_size=30),
)
def test_any_chunking_gives_the_whole_split(
    thinks: bool, pieces: list[str], cuts: list[int]
) -> None:
    """However the stream is cut (marks split anywhere), the pieces add up to the whole
    answer's split, and no mark of the thinking channel (which opens an answer) or of our
    calls leaks."""
    text = (THINK if thinks else "") + "".join(pieces)
    whole = split(text, [])
    assert split(text, cuts) == whole
    assert "<|channel>" not in whole[1] and "get_weather{" not in whole[1]


def gemma4_engine(reply: str) -> FakeEngine:
    return FakeEngine(replies=(reply,), generation_prompt="<|turn>model\n", max_model_len=4096)


HI = [{"role": "user", "content": "Weather in Paris?"}]
TOOLS: Any = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]


@pytest.mark.anyio
async def test_the_chat_route_returns_reasoning_and_calls_decoded_with_marks() -> None:
    fake = gemma4_engine(THINK + CALL)
    async with fake_server(fake) as (client, _):
        body = (
            await client.post(
                "/v1/chat/completions", json={"messages": HI, "tools": TOOLS, "max_tokens": 500}
            )
        ).json()
        response = await client.post(
            "/v1/chat/completions", json={"messages": HI, "stream": True, "max_tokens": 500}
        )
    choice = body["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["reasoning_content"] == "Need the weather tool."
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}
    # its marks are special tokens: the engine is asked to keep them in the text
    assert all(not s.params.skip_special_tokens for s in fake.submitted)
    deltas = [c["choices"][0]["delta"] for c in sse_chunks(response)]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Need the weather tool."
    assert "".join(d.get("content", "") for d in deltas) == CALL  # no tools: the call is text


@pytest.mark.anyio
async def test_responses_and_messages_get_the_same_split() -> None:
    response, message = await on_responses_and_messages(lambda: gemma4_engine(THINK + CALL))
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "Need the weather tool."
    assert call.type == "function_call" and json.loads(call.arguments) == {
        "city": "Paris",
        "days": 3,
    }
    thinking, use = message.content
    assert thinking.type == "thinking" and thinking.thinking == "Need the weather tool."
    assert use.type == "tool_use" and use.input == {"city": "Paris", "days": 3}
