"""/tokenize, /detokenize and the render routes over a FakeEngine (one token per character):
vLLM's shapes, and the render's ids being exactly what the generating route submits."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error

pytestmark = pytest.mark.anyio

HI = [{"role": "user", "content": "Hi"}]
CHAT_PROMPT = "<user>Hi<assistant>"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


async def test_tokenize_a_prompt() -> None:
    async with fake_server() as (client, _):
        body = (await client.post("/tokenize", json={"prompt": "ab"})).json()
        strs = await client.post("/tokenize", json={"prompt": "ab", "return_token_strs": True})
    assert body == {"count": 2, "max_model_len": 64, "tokens": [97, 98], "token_strs": None}
    assert strs.json()["token_strs"] == ["<97>", "<98>"]


async def test_tokenize_messages_with_the_template() -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        body = (await client.post("/tokenize", json={"messages": HI})).json()
        bare = await client.post(
            "/tokenize",
            json={
                "messages": [*HI, {"role": "assistant", "content": "Hel"}],
                "add_generation_prompt": False,
                "continue_final_message": True,
                "chat_template_kwargs": {"enable_thinking": False},
            },
        )
    assert body["tokens"] == [ord(c) for c in CHAT_PROMPT]
    assert body["count"] == len(CHAT_PROMPT)
    assert bare.json()["tokens"] == [ord(c) for c in "<user>Hi<assistant>Hel"]
    assert fake.template_vars[-1] == {"enable_thinking": False}


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "prompt"),
        ({"prompt": "a", "messages": HI}, "prompt"),
        ({"prompt": "a", "model": "other"}, "model"),
        (
            {"messages": HI, "add_generation_prompt": True, "continue_final_message": True},
            "continue_final_message",
        ),
    ],
)
async def test_tokenize_refusals(body: dict[str, Any], param: str) -> None:
    async with fake_server() as (client, _):
        openai_error(await client.post("/tokenize", json=body), 400, param=param)


async def test_detokenize() -> None:
    async with fake_server() as (client, _):
        ok = await client.post("/detokenize", json={"tokens": [72, 105]})
        bad = await client.post("/detokenize", json={"tokens": [72, -1]})
    assert ok.json() == {"prompt": "Hi"}
    openai_error(bad, 400, param="tokens")


CHATS = [
    {"messages": HI},
    {"messages": HI, "tools": TOOLS},  # the server's tool prompt is rendered in
    {"messages": HI, "tools": TOOLS, "tool_choice": "required"},
    {"messages": HI, "response_format": {"type": "json_object"}},
    {"messages": HI, "chat_template_kwargs": {"enable_thinking": True}},
]


@pytest.mark.parametrize("request_body", CHATS)
async def test_chat_render_ids_are_what_the_chat_route_prefills(
    request_body: dict[str, Any],
) -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        rendered = (await client.post("/v1/chat/completions/render", json=request_body)).json()
        assert not fake.submitted  # nothing generated
        await client.post("/v1/chat/completions", json=request_body)
    [submitted] = fake.submitted
    assert rendered["token_ids"] == submitted.prompt_ids
    assert rendered["prompt"] == "".join(chr(i) for i in submitted.prompt_ids)
    assert rendered["request_id"].startswith("chatcmpl-")
    assert rendered["model"] == "fake-model" and rendered["features"] is None
    params = rendered["sampling_params"]
    assert params["max_tokens"] == submitted.params.max_tokens
    grammar = submitted.params.grammar
    assert params["structured_outputs"] == (
        None if grammar is None else {grammar.kind: grammar.text}
    )


async def test_completion_render_answers_one_request_per_prompt() -> None:
    fake = FakeEngine()
    body = {"prompt": ["ab", "c"], "max_tokens": 3, "temperature": 0}
    async with fake_server(fake) as (client, _):
        rendered = (await client.post("/v1/completions/render", json=body)).json()
        await client.post("/v1/completions", json=body)
    assert [r["token_ids"] for r in rendered] == [s.prompt_ids for s in fake.submitted]
    assert [r["prompt"] for r in rendered] == ["ab", "c"]
    assert rendered[0]["sampling_params"]["max_tokens"] == 3
    assert rendered[0]["sampling_params"]["temperature"] == 0


async def test_render_refuses_as_the_generating_route_does() -> None:
    async with fake_server() as (client, _):
        response = await client.post(
            "/v1/chat/completions/render", json={"messages": HI, "top_logprobs": 99}
        )
    openai_error(response, 400, param="top_logprobs")
