"""response_format, structured_outputs, tools and Content-Type over a FakeEngine: what reaches the
engine (the grammar, the rendered conversation), what comes back (tool calls, whole and
streamed), and every refusal as its 4xx in OpenAI's shape."""

from __future__ import annotations

import json
from typing import Any

import pytest

from nanoserve.runtime.structured.grammar_spec import GrammarError, GrammarSpec
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error, sse_chunks

pytestmark = pytest.mark.anyio

HI = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
CALL_TEXT = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


async def post(fake: FakeEngine, path: str, body: dict[str, Any], **kw: Any):
    async with fake_server(fake) as (client, _):
        return await client.post(path, json=body, **kw)


# -- response_format and structured_outputs -------------------------------------------------


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, GrammarSpec.json_object()),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA, "strict": True}},
            GrammarSpec.json_schema(SCHEMA),
        ),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_response_format_becomes_the_grammar(fmt, expected, path: str) -> None:
    fake = FakeEngine()
    body: dict[str, Any] = {"messages": HI} if "chat" in path else {"prompt": "Hi"}
    response = await post(fake, path, {**body, "response_format": fmt})
    assert response.status_code == 200, response.text
    assert fake.submitted[0].params.grammar == expected
    assert fake.grammars == ([expected] if expected else [])  # compiled before submitting


@pytest.mark.parametrize(
    ("structured", "expected"),
    [
        ({"json": SCHEMA}, GrammarSpec.json_schema(SCHEMA)),
        ({"json": json.dumps(SCHEMA)}, GrammarSpec.json_schema(SCHEMA)),
        ({"regex": "[0-9]+"}, GrammarSpec("regex", "[0-9]+")),
        ({"choice": ["yes", "no"]}, GrammarSpec("choice", '["yes", "no"]')),
        ({"grammar": 'root ::= "a"'}, GrammarSpec("grammar", 'root ::= "a"')),
        ({"json_object": True}, GrammarSpec.json_object()),
    ],
)
async def test_structured_outputs_become_the_grammar(structured, expected) -> None:
    fake = FakeEngine()
    response = await post(
        fake, "/v1/completions", {"prompt": "Hi", "structured_outputs": structured}
    )
    assert response.status_code == 200, response.text
    assert fake.submitted[0].params.grammar == expected
    assert fake.submitted[0].params.grammar.source == "structured_outputs"


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"response_format": {"type": "bogus"}}, "response_format", "bogus"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema.schema"),
        ({"response_format": "json"}, "response_format", "Expected `object"),
        ({"structured_outputs": {}}, "structured_outputs", "exactly one"),
        (
            {"structured_outputs": {"regex": "a", "choice": ["a"]}},
            "structured_outputs",
            "got regex, choice",
        ),
        ({"structured_outputs": {"choice": []}}, "structured_outputs", "non-empty"),
        ({"structured_outputs": {"json": "{nope"}}, "structured_outputs", "not valid JSON"),
        ({"structured_outputs": {"grammar": "  "}}, "structured_outputs", "empty"),
        (
            {"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
            "structured_outputs",
            "send one",
        ),
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_bad_formats_are_400_naming_the_param(extra, param, message, path: str) -> None:
    fake = FakeEngine()
    body: dict[str, Any] = {"messages": HI} if "chat" in path else {"prompt": "Hi"}
    response = await post(fake, path, {**body, **extra})
    error = openai_error(response, 400, param=param)
    assert message in error["message"]
    assert not fake.submitted


async def test_a_schema_the_engine_cannot_compile_is_400() -> None:
    fake = FakeEngine(grammar_refusal=GrammarError("response_format", "Invalid type: bogus"))
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "bogus"}}}
    response = await post(fake, "/v1/chat/completions", {"messages": HI, "response_format": fmt})
    error = openai_error(response, 400, param="response_format")
    assert "bogus" in error["message"]
    assert not fake.submitted


# -- tools ------------------------------------------------------------------------------------


async def test_tools_go_into_the_system_prompt_when_the_template_cannot() -> None:
    fake = FakeEngine()
    response = await post(fake, "/v1/chat/completions", {"messages": HI, "tools": [WEATHER]})
    assert response.status_code == 200, response.text
    [messages] = fake.chats
    assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    assert (
        json.dumps({"type": "function", "function": WEATHER["function"]}) in messages[0]["content"]
    )
    assert messages[1:] == HI
    assert fake.submitted[0].params.grammar is None  # auto: free text, parsed afterwards


async def test_tool_choice_none_leaves_the_tools_out() -> None:
    fake = FakeEngine(replies=(CALL_TEXT,))
    body = {"messages": HI, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 200}
    response = await post(fake, "/v1/chat/completions", body)
    assert fake.chats == [HI]
    message = response.json()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": CALL_TEXT}


async def test_a_template_that_reads_tools_renders_them() -> None:
    fake = FakeEngine(template_reads_tools=True)
    history = [
        *HI,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    response = await post(fake, "/v1/chat/completions", {"messages": history, "tools": [WEATHER]})
    assert response.status_code == 200, response.text
    [messages] = fake.chats
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}
    assert messages[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}


async def test_tool_turns_are_written_back_for_a_template_that_cannot() -> None:
    fake = FakeEngine()
    history = [
        *HI,
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]
    await post(fake, "/v1/chat/completions", {"messages": history, "tools": [WEATHER]})
    [messages] = fake.chats
    assert messages[2] == {
        "role": "assistant",
        "content": '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>',
    }
    assert messages[3] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}


@pytest.mark.parametrize(
    ("choice", "parallel", "start"),
    [
        ("required", None, "start: call\n"),
        ("required", True, 'start: call ("\\n" call)*\n'),
        ({"type": "function", "function": {"name": "get_weather"}}, True, "start: call\n"),
    ],
)
async def test_required_and_named_choices_constrain_to_calls(choice, parallel, start: str) -> None:
    fake = FakeEngine(replies=(CALL_TEXT,))
    body = {"messages": HI, "tools": [WEATHER], "tool_choice": choice, "max_tokens": 200}
    if parallel is not None:
        body["parallel_tool_calls"] = parallel
    response = await post(fake, "/v1/chat/completions", body)
    grammar = fake.submitted[0].params.grammar
    assert grammar is not None
    assert grammar.kind == "lark" and grammar.source == "tools" and grammar.text.startswith(start)
    assert '"const": "get_weather"' in grammar.text
    [choice_body] = response.json()["choices"]
    assert choice_body["finish_reason"] == "tool_calls"
    message = choice_body["message"]
    assert message["content"] is None
    [call] = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


async def test_auto_keeps_the_text_around_calls_and_ignores_unknown_functions() -> None:
    other = '<tool_call>{"name": "launch", "arguments": {}}</tool_call>'
    fake = FakeEngine(replies=(f"Let me check. {CALL_TEXT}\n{other}",))
    body = {"messages": HI, "tools": [WEATHER], "max_tokens": 300}
    choice = (await post(fake, "/v1/chat/completions", body)).json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] == f"Let me check. {other}"
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["get_weather"]


async def test_a_cut_off_call_is_content_with_length() -> None:
    fake = FakeEngine(replies=(CALL_TEXT,))
    body = {"messages": HI, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 30}
    choice = (await post(fake, "/v1/chat/completions", body)).json()["choices"][0]
    assert choice["finish_reason"] == "length"
    assert choice["message"] == {"role": "assistant", "content": CALL_TEXT[:30]}


async def test_streamed_calls_reassemble_to_the_whole_answer() -> None:
    reply = f"Sure. {CALL_TEXT}\n{CALL_TEXT}"
    body = {"messages": HI, "tools": [WEATHER], "max_tokens": 300}
    whole = (await post(FakeEngine(replies=(reply,)), "/v1/chat/completions", body)).json()
    async with fake_server(FakeEngine(replies=(reply,))) as (client, _):
        response = await client.post("/v1/chat/completions", json={**body, "stream": True})
    chunks = sse_chunks(response)
    content, finish = "", None
    calls: dict[int, dict[str, Any]] = {}
    for chunk in chunks:
        [choice] = chunk["choices"]
        delta = choice["delta"]
        content += delta.get("content") or ""
        for part in delta.get("tool_calls") or []:
            call = calls.setdefault(part["index"], {"id": None, "name": "", "arguments": ""})
            call["id"] = part.get("id") or call["id"]
            function = part.get("function") or {}
            call["name"] += function.get("name") or ""
            call["arguments"] += function.get("arguments") or ""
        finish = choice["finish_reason"] or finish
    expected = whole["choices"][0]
    assert finish == expected["finish_reason"] == "tool_calls"
    assert content == expected["message"]["content"] == "Sure. "
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (c["function"]["name"], c["function"]["arguments"])
        for c in expected["message"]["tool_calls"]
    ]
    assert all(c["id"].startswith("call_") for c in calls.values())
    assert not any("<tool" in (ch["choices"][0]["delta"].get("content") or "") for ch in chunks)


@pytest.mark.parametrize(
    ("extra", "param", "message"),
    [
        ({"tools": "nope"}, "tools", "Expected `array"),
        (
            {"tools": [{"type": "retrieval", "function": {"name": "f"}}]},
            "tools",
            "must be 'function'",
        ),
        ({"tools": [{"type": "function"}]}, "tools[0]", "`function`"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools", "letters"),
        ({"tools": [WEATHER, WEATHER]}, "tools", "twice"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    }
                ]
            },
            "tools",
            "object schema",
        ),
        ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice", "'always'"),
        ({"tool_choice": "required"}, "tool_choice", "needs tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "not in tools",
        ),
        ({"tools": [WEATHER], "tool_choice": {"type": "function"}}, "tool_choice", "must be"),
        (
            {
                "tools": [WEATHER],
                "tool_choice": "required",
                "response_format": {"type": "json_object"},
            },
            "tool_choice",
            "cannot also",
        ),
    ],
)
async def test_bad_tools_are_400_naming_the_param(extra, param, message) -> None:
    fake = FakeEngine()
    response = await post(fake, "/v1/chat/completions", {"messages": HI, **extra})
    error = openai_error(response, 400, param=param)
    assert message in error["message"], error
    assert not fake.submitted


@pytest.mark.parametrize(
    ("message", "text"),
    [
        ({"role": "tool", "content": "x"}, "tool_call_id"),
        (
            {
                "role": "user",
                "content": "x",
                "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}],
            },
            "only assistant",
        ),
    ],
)
async def test_bad_tool_turns_are_400(message, text: str) -> None:
    fake = FakeEngine()
    response = await post(fake, "/v1/chat/completions", {"messages": [*HI, message]})
    assert text in openai_error(response, 400, param="messages")["message"]


# -- Content-Type -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/jsonx",
    ],
)
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_a_body_that_is_not_json_is_415(content_type: str | None, path: str) -> None:
    fake = FakeEngine()
    headers = {"content-type": content_type} if content_type else {}
    body = json.dumps({"messages": HI, "prompt": "Hi"}).encode()
    async with fake_server(fake) as (client, _):
        response = await client.post(path, content=body, headers=headers)
    error = openai_error(response, 415)
    assert "application/json" in error["message"]
    assert not fake.submitted


@pytest.mark.parametrize(
    "content_type",
    ["application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"],
)
async def test_json_with_parameters_is_accepted(content_type: str) -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        response = await client.post(
            "/v1/completions",
            content=json.dumps({"prompt": "Hi"}).encode(),
            headers={"content-type": content_type},
        )
    assert response.status_code == 200, response.text
