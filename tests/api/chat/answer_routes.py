"""One answer asked for on the Responses and the Messages routes, each with a weather tool: the
format tests (harmony, Gemma 4) check that both routes split it as the chat route does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tests.api.fake_engine import FakeEngine

HI = [{"role": "user", "content": "Weather in Paris?"}]


async def on_responses_and_messages(engine: Callable[[], FakeEngine]) -> tuple[Any, Any]:
    """(the Responses answer, the Messages answer), each from a fresh `engine()`."""
    from tests.api.messages.test_routes import messages_client
    from tests.api.responses.test_routes import responses_client

    async with responses_client(engine()) as (oc, _):
        response = await oc.responses.create(
            model="fake-model",
            input="Weather in Paris?",
            tools=[{"type": "function", "name": "get_weather", "parameters": {}}],  # type: ignore[list-item]
            max_output_tokens=500,
        )
    async with messages_client(engine()) as (ac, _):
        message = await ac.messages.create(
            model="fake-model",
            max_tokens=500,
            messages=HI,  # type: ignore[arg-type]
            tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
        )
    return response, message
