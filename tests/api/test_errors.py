"""Every client mistake is a 4xx with OpenAI's error body; none is a 500."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

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
    ("/v1/completions", {**COMPLETION, "logit_bias": {"999999999": 1}}, "logit_bias"),
    ("/v1/completions", {**COMPLETION, "stop_token_ids": [10**9]}, "stop_token_ids"),
    ("/v1/completions", {**COMPLETION, "stop_token_ids": [-1]}, "stop_token_ids"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 10**30}, "max_tokens"),
    ("/v1/completions", {**COMPLETION, "seed": 2**64}, "seed"),
    ("/v1/completions", {**COMPLETION, "seed": -(2**63) - 1}, "seed"),
    ("/v1/chat/completions", {**CHAT, "seed": 2**70}, "seed"),
    ("/v1/completions", {"prompt": [10**9]}, "prompt"),
    ("/v1/completions", {"prompt": [-1]}, "prompt"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 21, "logprobs": True}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "temperature": 9}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": 0}, "max_tokens"),
    # unknown model
    ("/v1/completions", {**COMPLETION, "model": "gpt-4"}, "model"),
    ("/v1/chat/completions", {**CHAT, "model": "gpt-4"}, "model"),
    # prompt + max_tokens beyond max_model_len (1024)
    ("/v1/completions", {**COMPLETION, "max_tokens": 1024}, "max_tokens"),
    ("/v1/completions", {"prompt": [5] * 1024, "max_tokens": 1}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 1024}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": None, "max_completion_tokens": 5000}, None),
    # empty prompts and messages
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/v1/completions", {"prompt": [[]]}, "prompt"),
    ("/v1/completions", {"prompt": ["hi", ""]}, "prompt"),
    ("/v1/chat/completions", {"messages": []}, "messages"),
    # unsupported chat content
    ("/v1/chat/completions", {"messages": [{"role": "tool", "content": "x"}]}, "messages"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "messages",
    ),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("route", "body", "param"), BAD_REQUESTS, ids=[str(i) for i in range(len(BAD_REQUESTS))]
)
def test_bad_request_is_400(
    http: httpx.Client,
    assert_openai_error: Callable[..., dict[str, Any]],
    route: str,
    body: dict[str, Any],
    param: str | None,
    stream: bool,
) -> None:
    if stream and "stream" in body:
        pytest.skip("the case is about the stream field itself")
    response = http.post(route, json={**body, "stream": True} if stream else body)
    error = assert_openai_error(response, 400)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error


def test_unknown_model_has_code(
    http: httpx.Client, assert_openai_error: Callable[..., dict[str, Any]]
) -> None:
    response = http.post("/v1/completions", json={**COMPLETION, "model": "gpt-4"})
    error = assert_openai_error(response, 400, param="model", code="model_not_found")
    assert "gpt-4" in error["message"]


def test_too_long_names_the_numbers(
    http: httpx.Client, assert_openai_error: Callable[..., dict[str, Any]]
) -> None:
    response = http.post("/v1/completions", json={"prompt": [5] * 1000, "max_tokens": 100})
    error = assert_openai_error(response, 400, param="max_tokens")
    assert "1000" in error["message"] and "1024" in error["message"], error


DEEP = b'{"prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"  # 40 KB, under the body limit


@pytest.mark.parametrize(
    "raw",
    [
        b"{bad json",
        b"",
        b"null",
        b"[1, 2]",
        b'"a string"',
        b'{"prompt": "hi",}',
        b"\xff\xfe",
        b'{"prompt": "hi", "temperature": NaN}',
        b'{"prompt": "hi", "temperature": 1e999}',
        b'{"prompt": "\\ud800"}',
        DEEP,
    ],
    ids=[
        "truncated",
        "empty",
        "null",
        "array",
        "string",
        "trailing-comma",
        "not-utf8",
        "nan",
        "overflow",
        "lone-surrogate",
        "too-deep",
    ],
)
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_malformed_json_is_400(
    http: httpx.Client,
    assert_openai_error: Callable[..., dict[str, Any]],
    route: str,
    raw: bytes,
) -> None:
    response = http.post(route, content=raw, headers={"content-type": "application/json"})
    assert_openai_error(response, 400)


def test_form_body_is_4xx(
    http: httpx.Client, assert_openai_error: Callable[..., dict[str, Any]]
) -> None:
    response = http.post("/v1/completions", data={"prompt": "hi"})
    assert 400 <= response.status_code < 500
    assert_openai_error(response, response.status_code)


@pytest.mark.parametrize(
    "path", ["/v1/nothing", "/v2/completions", "/", "/v1/completions/extra", "/v1/models/x"]
)
def test_unknown_route_is_404(
    http: httpx.Client, assert_openai_error: Callable[..., dict[str, Any]], path: str
) -> None:
    assert_openai_error(http.get(path), 404)
    assert_openai_error(http.post(path, json=COMPLETION), 404)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/completions"),
        ("GET", "/v1/chat/completions"),
        ("DELETE", "/v1/completions"),
        ("PUT", "/v1/chat/completions"),
        ("POST", "/v1/models"),
        ("POST", "/health"),
        ("POST", "/metrics"),
    ],
)
def test_wrong_method_is_405(
    http: httpx.Client,
    assert_openai_error: Callable[..., dict[str, Any]],
    method: str,
    path: str,
) -> None:
    response = http.request(method, path, json=COMPLETION if method != "GET" else None)
    assert_openai_error(response, 405)
    allowed = {m.strip() for m in response.headers["allow"].split(",")}
    assert method not in allowed and allowed, allowed


@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
def test_body_over_limit_is_413(
    http: httpx.Client, assert_openai_error: Callable[..., dict[str, Any]], route: str
) -> None:
    big = "word " * 20_000  # 100 KB, over the main server's 64 KiB
    body = (
        {"prompt": big}
        if route == "/v1/completions"
        else {"messages": [{"role": "user", "content": big}]}
    )
    assert_openai_error(http.post(route, json=body), 413)


def test_body_just_under_limit_is_not_413(
    http: httpx.Client, assert_openai_error: Callable[..., dict[str, Any]]
) -> None:
    # 60 KB of prompt: accepted by the body limit, refused (400) for its token count.
    response = http.post("/v1/completions", json={"prompt": "word " * 12_000, "max_tokens": 1})
    assert_openai_error(response, 400, param="max_tokens")


def test_errors_leave_the_server_healthy(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    response = http.post("/v1/completions", json={**COMPLETION, "temperature": 0})
    assert response.status_code == 200, response.text
