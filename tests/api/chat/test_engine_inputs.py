"""From OpenAI request fields to the engine's inputs: every field the server refuses before the
engine sees the request is a 400 naming it, and what it accepts arrives translated.

Refusals the engine makes itself (token ids outside the vocabulary, a prompt plus max_tokens
beyond the context) are the live server's to show: test_errors.py.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from nanoserve.api.chat.engine_inputs import (
    ChatInputs,
    CompletionInputs,
    Prompt,
    translate_chat,
    translate_completion,
)
from nanoserve.api.chat.schemas import ChatRequest, CompletionRequest
from nanoserve.api.server.errors import APIError
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams, SamplingParamsError
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "hi", "max_tokens": 2}

# (route, body, the `param` the error names, or None when any is fine)
BAD_REQUESTS = [
    # wrong types
    ("/v1/completions", {**COMPLETION, "max_tokens": "eight"}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "temperature": "hot"}, "temperature"),
    ("/v1/completions", {**COMPLETION, "n": 1.5}, "n"),
    ("/v1/completions", {**COMPLETION, "stream": "yes"}, "stream"),
    ("/v1/completions", {**COMPLETION, "seed": 1.5}, "seed"),
    ("/v1/completions", {**COMPLETION, "stop": 5}, "stop"),
    ("/v1/completions", {**COMPLETION, "logprobs": True}, "logprobs"),
    ("/v1/completions", {"prompt": 42}, "prompt"),
    ("/v1/completions", {"prompt": [1, "a"]}, "prompt"),
    ("/v1/completions", {"prompt": [[1, 2], ["a"]]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"not-a-token": 1}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": "hi"}, "messages"),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, None),
    ("/v1/chat/completions", {**CHAT, "logprobs": 3}, "logprobs"),
    # missing fields
    ("/v1/completions", {"max_tokens": 2}, None),
    ("/v1/chat/completions", {"max_tokens": 2}, None),
    # out-of-range values
    ("/v1/completions", {**COMPLETION, "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "temperature": 2.5}, "temperature"),
    ("/v1/completions", {**COMPLETION, "temperature": -0.1}, "temperature"),
    ("/v1/completions", {**COMPLETION, "top_p": 0}, "top_p"),
    ("/v1/completions", {**COMPLETION, "top_p": 1.5}, "top_p"),
    ("/v1/completions", {**COMPLETION, "top_k": -2}, "top_k"),
    ("/v1/completions", {**COMPLETION, "min_p": 2}, "min_p"),
    ("/v1/completions", {**COMPLETION, "n": 0}, "n"),
    ("/v1/completions", {**COMPLETION, "n": 1000}, "n"),
    ("/v1/completions", {**COMPLETION, "presence_penalty": 3}, "presence_penalty"),
    ("/v1/completions", {**COMPLETION, "frequency_penalty": -3}, "frequency_penalty"),
    ("/v1/completions", {**COMPLETION, "repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/completions", {**COMPLETION, "logprobs": 21}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "logprobs": -1}, "logprobs"),
    ("/v1/completions", {**COMPLETION, "stop": [""]}, "stop"),
    ("/v1/completions", {**COMPLETION, "stop": ["x"] * 17}, "stop"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"5": 1000}}, "logit_bias"),
    ("/v1/completions", {**COMPLETION, "logit_bias": {"-5": 1}}, "logit_bias"),
    ("/v1/completions", {**COMPLETION, "stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/completions", {**COMPLETION, "seed": 2**64}, "seed"),
    ("/v1/completions", {**COMPLETION, "seed": -(2**63) - 1}, "seed"),
    ("/v1/chat/completions", {**CHAT, "seed": 2**70}, "seed"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": -1, "logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "temperature": 9}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 0}, "max_tokens"),
    # unknown model
    ("/v1/completions", {**COMPLETION, "model": "gpt-4"}, "model"),
    ("/v1/chat/completions", {**CHAT, "model": "gpt-4"}, "model"),
    # empty prompts and messages
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    # unsupported chat content
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages",
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("route", "body", "param"), BAD_REQUESTS, ids=[str(i) for i in range(len(BAD_REQUESTS))]
)
async def test_bad_request_is_400_before_the_engine(
    route: str, body: dict[str, Any], param: str | None, stream: bool
) -> None:
    if stream and "stream" in body:
        pytest.skip("the case is about the stream field itself")
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        response = await client.post(route, json={**body, "stream": True} if stream else body)
    error = openai_error(response, 400, type="invalid_request_error")
    if param is not None:
        assert error["param"] == param, error
    assert fake.submitted == []


@pytest.mark.anyio
async def test_unknown_model_names_both() -> None:
    async with fake_server() as (client, _):
        response = await client.post("/v1/completions", json={**COMPLETION, "model": "gpt-4"})
    openai_error(
        response,
        400,
        param="model",
        code="model_not_found",
        message="the model 'gpt-4' is not served here; this server serves 'fake-model'",
    )


# -- the translation itself, without HTTP --------------------------------------------------------


def completion(**fields: Any) -> CompletionInputs:
    request = msgspec.convert({"prompt": "hi", **fields}, CompletionRequest)
    return translate_completion(request, FakeEngine())


def chat(**fields: Any) -> ChatInputs:
    request = msgspec.convert(
        {"messages": [{"role": "user", "content": "Hi"}], **fields}, ChatRequest
    )
    return translate_chat(request, FakeEngine())


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        ("Hi", [Prompt("Hi", [72, 105])]),
        (["Hi", "a"], [Prompt("Hi", [72, 105]), Prompt("a", [97])]),
        ([72, 105], [Prompt(None, [72, 105])]),
        ([[72], [105, 33]], [Prompt(None, [72]), Prompt(None, [105, 33])]),
    ],
    ids=["text", "texts", "ids", "id-lists"],
)
def test_completion_prompt_forms(prompt: Any, expected: list[Prompt]) -> None:
    inputs = completion(prompt=prompt)
    assert inputs.prompts == expected
    assert inputs.prompt_tokens == sum(len(p.token_ids) for p in expected)


def test_completion_inputs() -> None:
    inputs = completion(max_tokens=3, logprobs=2, echo=True, n=2)
    assert inputs == CompletionInputs(
        prompts=[Prompt("hi", [104, 105])],
        params=SamplingParams(max_tokens=3, logprobs=2, n=2),
        echo=True,
        include_usage=False,
        n=2,
        show_logprobs=True,
    )
    assert completion().params.max_tokens == 16  # OpenAI's legacy default
    with_usage = completion(stream=True, stream_options={"include_usage": True})
    assert with_usage.include_usage


@pytest.mark.parametrize("prompt", [[True], [[1], [True]], [1.5]])
def test_booleans_and_floats_are_not_token_ids(prompt: list[Any]) -> None:
    with pytest.raises(APIError) as refused:
        completion(prompt=prompt)
    assert (refused.value.status, refused.value.param) == (400, "prompt")


def test_chat_inputs() -> None:
    inputs = chat(logprobs=True)
    assert inputs.prompt_ids == [ord(c) for c in "<user>Hi<assistant>"]
    # Unset max_tokens: the engine's default for this prompt, not 16.
    assert inputs.params == SamplingParams(max_tokens=64 - 19, logprobs=0)
    assert not inputs.include_usage


@pytest.mark.parametrize(
    ("fields", "max_tokens", "logprobs"),
    [
        ({}, 45, None),
        ({"max_tokens": 5}, 5, None),
        ({"max_completion_tokens": 3}, 3, None),
        ({"max_tokens": 5, "max_completion_tokens": 3}, 3, None),
        ({"logprobs": True}, 45, 0),
        ({"logprobs": True, "top_logprobs": 4}, 45, 4),
        ({"logprobs": False, "top_logprobs": 0}, 45, None),
    ],
)
def test_chat_max_tokens_and_logprobs(
    fields: dict[str, Any], max_tokens: int, logprobs: int | None
) -> None:
    inputs = chat(**fields)
    assert (inputs.params.max_tokens, inputs.params.logprobs) == (max_tokens, logprobs)


def test_checks_come_in_field_order() -> None:
    """The model is checked first, then logprobs, then the sampling fields, then the prompt."""
    with pytest.raises(APIError) as refused:
        completion(model="gpt-4", logprobs=99, prompt=[])
    assert refused.value.param == "model"
    with pytest.raises(APIError) as refused:
        completion(logprobs=99, temperature=9.0, prompt=[])
    assert refused.value.param == "logprobs"
    with pytest.raises(SamplingParamsError) as bad:
        completion(temperature=9.0, prompt=[])
    assert bad.value.field == "temperature"
