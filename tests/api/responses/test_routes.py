"""/v1/responses over a FakeEngine, through the `openai` client's own `responses.create` and
`responses.stream` (its event accumulator checks the order and identity of every item)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, cast

import openai
import pytest

from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error

pytestmark = pytest.mark.anyio

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOLS: Any = [
    {
        "type": "function",
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]


@asynccontextmanager
async def responses_client(fake: FakeEngine) -> AsyncIterator[tuple[openai.AsyncOpenAI, Any]]:
    async with fake_server(fake) as (client, _):
        yield (
            openai.AsyncOpenAI(
                base_url="http://testserver.local/v1",
                api_key="-",
                http_client=cast(Any, client),
            ),
            client,
        )


async def test_a_text_answer() -> None:
    fake = FakeEngine(replies=("Hello!",))
    async with responses_client(fake) as (oc, _):
        response = await oc.responses.create(model="fake-model", input="Hi", temperature=0)
    assert response.status == "completed" and response.output_text == "Hello!"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert fake.chats == [[{"role": "user", "content": "Hi"}]]
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (19, 6)
    assert fake.submitted[0].params.temperature == 0


async def test_items_instructions_and_a_tool_round_trip_are_one_conversation() -> None:
    fake = FakeEngine(replies=("Sunny.",), max_model_len=4096)
    items: Any = [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sun"},
    ]
    async with responses_client(fake) as (oc, _):
        response = await oc.responses.create(
            model="fake-model",
            input=items,
            instructions="Be brief.",
            tools=TOOLS,
            max_output_tokens=50,
        )
    assert response.output_text == "Sunny."
    [chat] = fake.chats
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[0]["content"].startswith("Be brief.\n\nYou can call functions")
    assert chat[2]["content"] == '<tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'


async def test_an_assistant_message_and_its_calls_are_one_turn() -> None:
    fake = FakeEngine(replies=("ok",), max_model_len=4096)
    items: Any = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Let me look."},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sun"},
    ]
    async with responses_client(fake) as (oc, _):
        await oc.responses.create(model="fake-model", input=items, tools=TOOLS, max_output_tokens=5)
    [chat] = fake.chats
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[2]["content"].startswith("Let me look.\n<tool_call>")
    assert chat[3]["content"] == "<tool_response>\nsun\n</tool_response>"


async def test_a_function_call_and_reasoning_become_items() -> None:
    fake = FakeEngine(
        replies=(f"<think>hm</think>{CALL}",), template_thinks=True, max_model_len=4096
    )
    async with responses_client(fake) as (oc, _):
        response = await oc.responses.create(
            model="fake-model", input="Weather in Paris?", tools=TOOLS, max_output_tokens=500
        )
    reasoning, call = response.output
    assert reasoning.type == "reasoning" and reasoning.content is not None
    assert reasoning.content[0].text == "hm"
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments) == {"city": "Paris"}
    assert call.call_id.startswith("call_")


async def test_the_stream_comes_in_order_and_adds_up_to_the_answer() -> None:
    fake = FakeEngine(
        replies=(f"<think>hm</think>Hi {CALL}",), template_thinks=True, max_model_len=4096
    )
    async with (
        responses_client(fake) as (oc, _),
        oc.responses.stream(
            model="fake-model", input="x", tools=TOOLS, max_output_tokens=500
        ) as stream,
    ):
        events = [event async for event in stream]
        final = await stream.get_final_response()
    kinds = [e.type for e in events]
    item = [
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds == [
        "response.created",
        "response.in_progress",
        *item,
        "response.reasoning_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.output_item.done",
        *item,
        *["response.output_text.delta"] * 3,  # "H", "i", " "
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert final.status == "completed" and final.output_text == "Hi "
    assert [o.type for o in final.output] == ["reasoning", "message", "function_call"]


async def test_max_output_tokens_makes_it_incomplete() -> None:
    fake = FakeEngine(replies=("Hello!",))
    async with responses_client(fake) as (oc, _):
        whole = await oc.responses.create(model="fake-model", input="x", max_output_tokens=2)
        async with oc.responses.stream(
            model="fake-model", input="x", max_output_tokens=2
        ) as stream:
            kinds = [e.type async for e in stream]
    assert whole.status == "incomplete" and whole.output_text == "He"
    assert whole.incomplete_details is not None
    assert whole.incomplete_details.reason == "max_output_tokens"
    assert kinds[-1] == "response.incomplete"


async def test_text_format_is_the_grammar() -> None:
    fake = FakeEngine(replies=('{"a": 1}',))
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    async with responses_client(fake) as (oc, _):
        await oc.responses.create(
            model="fake-model",
            input="x",
            text=cast(Any, {"format": {"type": "json_schema", "name": "A", "schema": schema}}),
        )
    [grammar] = fake.grammars
    assert grammar.kind == "json_schema" and json.loads(grammar.text)["properties"]["a"]["maximum"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input"),
        ({"input": [{"type": "web_search_call"}]}, "input"),
        ({"input": []}, "input"),
        ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
        ({"input": "x", "model": "gpt-9"}, "model"),
    ],
)
async def test_refusals(body: dict[str, Any], param: str) -> None:
    async with fake_server() as (client, _):
        openai_error(await client.post("/v1/responses", json=body), 400, param=param)
