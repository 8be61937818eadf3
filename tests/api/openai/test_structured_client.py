"""Structured outputs and tool calls through the official `openai` client, on the live server
(the embedded SmolLM2): what a user of `parse()` and of function calling sees."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

pytestmark = pytest.mark.slow

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 40}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=40)
    age: int = pydantic.Field(ge=0, le=150)


def test_parse_returns_the_pydantic_object(client: Any, model_name: str) -> None:
    completion = client.chat.completions.parse(
        model=model_name,
        messages=[{"role": "user", "content": "Invent a person."}],
        response_format=Person,
        temperature=0,
        max_tokens=64,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Person)
    assert Person.model_validate_json(choice.message.content) == choice.message.parsed


class City(pydantic.BaseModel):
    name: str
    country: str
    population: int


def test_an_open_integer_ends(client: Any, model_name: str) -> None:
    """An integer with no bounds: the grammar closes it at 2**53-1 (16 digits), so the answer
    ends with stop rather than a population of 1111... until max_tokens."""
    completion = client.chat.completions.parse(
        model=model_name,
        messages=[{"role": "user", "content": "Describe the city of Lyon."}],
        response_format=City,
        temperature=0,
        max_tokens=200,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, City)
    assert abs(choice.message.parsed.population) <= 2**53 - 1


def test_json_object_parses(client: Any, model_name: str) -> None:
    completion = client.chat.completions.create(
        model=model_name,
        messages=[
            {
                "role": "user",
                "content": "Give a JSON object with the keys name and color for a fruit.",
            }
        ],
        response_format={"type": "json_object"},
        temperature=0,
        max_tokens=120,
    )
    assert completion.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(completion.choices[0].message.content), dict)


def test_a_tool_round_trip(client: Any, model_name: str) -> None:
    first = client.chat.completions.create(
        model=model_name,
        messages=ASK,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_tokens=64,
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert set(json.loads(call.function.arguments)) == {"city"}
    history = [
        *ASK,
        choice.message.model_dump(exclude_none=True),
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": json.dumps({"sky": "cloudy", "c": 18}),
        },
    ]
    answer = client.chat.completions.create(
        model=model_name, messages=history, tools=[WEATHER], temperature=0, max_tokens=40
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content
    assert not answer.choices[0].message.tool_calls


def test_streamed_tool_calls_reassemble_to_the_same_call(client: Any, model_name: str) -> None:
    named = {"type": "function", "function": {"name": "get_weather"}}
    kwargs = {"model": model_name, "messages": ASK, "tools": [WEATHER], "tool_choice": named}
    whole = client.chat.completions.create(**kwargs, temperature=0, max_tokens=64)
    calls: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(
        **kwargs, temperature=0, max_tokens=64, stream=True
    ):
        if not chunk.choices:
            continue
        for part in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            call["id"] = part.id or call["id"]
            if part.function is not None:
                call["name"] += part.function.name or ""
                call["arguments"] += part.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    [expected] = whole.choices[0].message.tool_calls
    assert finish == whole.choices[0].finish_reason == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (expected.function.name, expected.function.arguments)
    ]
    assert calls[0]["id"].startswith("call_")
