"""The `anthropic` client's Messages calls against the live server (the embedded SmolLM2):
streamed and not, with a tool."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = pytest.mark.slow

WEATHER: Any = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


@pytest.fixture()
def claude(server: Any) -> Iterator[Any]:
    import anthropic

    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0) as client:
        yield client


def test_create_and_stream_agree(claude: Any, model_name: str) -> None:
    kwargs: Any = {
        "model": model_name,
        "max_tokens": 40,
        "extra_body": {"temperature": 0},  # this SDK no longer sends temperature itself
        "messages": [{"role": "user", "content": "Say just: hello."}],
    }
    whole = claude.messages.create(**kwargs)
    with claude.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert whole.content[0].text == text == final.content[0].text
    assert whole.stop_reason == final.stop_reason == "end_turn"
    assert (
        claude.messages.count_tokens(model=model_name, messages=kwargs["messages"]).input_tokens
        == whole.usage.input_tokens
    )


def test_a_tool_use(claude: Any, model_name: str) -> None:
    message = claude.messages.create(
        model=model_name,
        max_tokens=64,
        extra_body={"temperature": 0},
        tools=[WEATHER],
        tool_choice={"type": "any"},
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
    )
    [use] = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use"
    assert use.name == "get_weather" and set(use.input) == {"city"}
