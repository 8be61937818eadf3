"""/v1/messages and /v1/messages/count_tokens over a FakeEngine, through the `anthropic` client
(its stream accumulator builds the message from the events), and errors in Anthropic's shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import httpx2
import pytest

from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server

pytestmark = pytest.mark.anyio

CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
TOOLS: Any = [
    {
        "name": "get_weather",
        "description": "Weather",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
    }
]
HI: Any = [{"role": "user", "content": "Hi"}]


@asynccontextmanager
async def messages_client(
    fake: FakeEngine, **settings: Any
) -> AsyncIterator[tuple[anthropic.AsyncAnthropic, Any]]:
    async with fake_server(fake, **settings) as (client, _):
        yield (
            anthropic.AsyncAnthropic(
                base_url="http://testserver.local",
                api_key=settings.get("api_key", "-"),
                # the SDK speaks httpx2: its own ASGI transport, into the app the test client runs
                http_client=httpx2.AsyncClient(transport=httpx2.ASGITransport(app=client.app)),
                max_retries=0,
            ),
            client,
        )


async def test_a_text_message() -> None:
    fake = FakeEngine(replies=("Hello!",))
    async with messages_client(fake) as (ac, _):
        message = await ac.messages.create(
            model="fake-model", max_tokens=20, system="Be kind.", messages=HI
        )
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert fake.chats == [
        [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi"}]
    ]
    assert message.usage.input_tokens == len("<system>Be kind.<user>Hi<assistant>")
    assert message.usage.output_tokens == 6


async def test_a_last_assistant_message_is_a_prefill_the_reply_continues() -> None:
    fake = FakeEngine(replies=('"a": 1}',))
    async with messages_client(fake) as (ac, _):
        await ac.messages.create(
            model="fake-model",
            max_tokens=10,
            messages=[*HI, {"role": "assistant", "content": "{"}],
        )
    [submitted] = fake.submitted
    assert "".join(map(chr, submitted.prompt_ids)) == "<user>Hi<assistant>{"


async def test_cache_reads_are_not_input_tokens() -> None:
    fake = FakeEngine(replies=("Hello!",), cached_tokens=8)
    async with messages_client(fake) as (ac, _):
        whole = await ac.messages.create(model="fake-model", max_tokens=20, messages=HI)
        async with ac.messages.stream(model="fake-model", max_tokens=20, messages=HI) as stream:
            streamed = await stream.get_final_message()
    prompt = len("<user>Hi<assistant>")
    for message in (whole, streamed):
        assert message.usage.cache_read_input_tokens == 8
        assert message.usage.input_tokens == prompt - 8


async def test_stop_sequences_and_max_tokens_are_stop_reasons() -> None:
    fake = FakeEngine(replies=("Hello!",))
    async with messages_client(fake) as (ac, _):
        cut = await ac.messages.create(model="fake-model", max_tokens=2, messages=HI)
    assert cut.stop_reason == "max_tokens"
    assert fake.submitted[0].params.max_tokens == 2


async def test_a_tool_use_round_trip() -> None:
    fake = FakeEngine(replies=(f"<think>hm</think>{CALL}",), template_thinks=True)
    async with messages_client(fake) as (ac, _):
        first = await ac.messages.create(
            model="fake-model", max_tokens=100, messages=HI, tools=TOOLS
        )
        thinking, use = first.content
        assert thinking.type == "thinking" and thinking.thinking == "hm"
        assert use.type == "tool_use" and use.name == "get_weather"
        assert use.input == {"city": "Paris"} and first.stop_reason == "tool_use"
        await ac.messages.create(
            model="fake-model",
            max_tokens=10,
            tools=TOOLS,
            messages=[
                *HI,
                {"role": "assistant", "content": [use.model_dump()]},  # type: ignore[misc, list-item]
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sun"}],
                },
            ],
        )
    chat = fake.chats[1]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "user"]
    assert chat[2]["content"] == CALL
    assert chat[3]["content"] == "<tool_response>\nsun\n</tool_response>"


async def test_the_stream_builds_the_same_message() -> None:
    fake = FakeEngine(replies=(f"<think>hm</think>Hi {CALL}",), template_thinks=True)
    async with (
        messages_client(fake) as (ac, _),
        ac.messages.stream(model="fake-model", max_tokens=100, messages=HI, tools=TOOLS) as stream,
    ):
        kinds = [e.type async for e in stream]
        final = await stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[1].text == "Hi "  # type: ignore[union-attr]
    assert final.content[2].input == {"city": "Paris"}  # type: ignore[union-attr]
    assert final.stop_reason == "tool_use" and final.usage.output_tokens > 0


async def test_count_tokens() -> None:
    async with messages_client(FakeEngine()) as (ac, _):
        counted = await ac.messages.count_tokens(model="fake-model", messages=HI)
    assert counted.input_tokens == len("<user>Hi<assistant>")


async def test_errors_are_anthropic_shaped() -> None:
    async with messages_client(FakeEngine()) as (ac, client):
        with pytest.raises(anthropic.BadRequestError) as caught:
            await ac.messages.create(model="fake-model", max_tokens=10, messages=[])
        missing = await client.post("/v1/messages", json={"messages": HI})
        image = await client.post(
            "/v1/messages",
            json={"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image"}]}]},
        )
    assert caught.value.body["type"] == "error"  # type: ignore[index]
    for response in (missing, image):
        assert response.status_code == 400
        body = response.json()
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert set(body["error"]) == {"type", "message"}


async def test_x_api_key_is_the_key() -> None:
    async with messages_client(FakeEngine(), api_key="sekret") as (ac, client):
        ok = await ac.messages.create(model="fake-model", max_tokens=3, messages=HI)
        refused = await client.post(
            "/v1/messages", json={"max_tokens": 3, "messages": HI}, headers={"x-api-key": "no"}
        )
    assert ok.content
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "authentication_error"
