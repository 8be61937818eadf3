"""The `openai` client's Responses calls against the live server (the embedded SmolLM2):
streamed and not, with a tool call and its result sent back."""

from __future__ import annotations

import json
from typing import Any

import pytest

pytestmark = pytest.mark.slow

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def test_create_and_stream_give_the_same_greedy_text(client: Any, model_name: str) -> None:
    kwargs = {"model": model_name, "input": "Say just: hello.", "temperature": 0}
    whole = client.responses.create(**kwargs, max_output_tokens=60)
    with client.responses.stream(**kwargs, max_output_tokens=60) as stream:
        deltas = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert whole.output_text and "".join(deltas) == whole.output_text == final.output_text
    assert whole.status == "completed"
    assert whole.usage.input_tokens == final.usage.input_tokens > 0


def test_a_function_call_round_trip(client: Any, model_name: str) -> None:
    first = client.responses.create(
        model=model_name,
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_output_tokens=64,
    )
    [call] = [o for o in first.output if o.type == "function_call"]
    assert call.name == "get_weather" and set(json.loads(call.arguments)) == {"city"}
    second = client.responses.create(
        model=model_name,
        input=[
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "type": "function_call",
                "call_id": call.call_id,
                "name": call.name,
                "arguments": call.arguments,
            },
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"},
        ],
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=40,
    )
    assert second.output_text
