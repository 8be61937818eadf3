"""Every client mistake is a 4xx with OpenAI's error body; none is a 500.

HTTP-level mistakes (bad JSON, unknown routes and methods, bodies over the limit) are shown
in-process over a FakeEngine; refusals only the real engine makes (token ids outside its
vocabulary, a prompt plus max_tokens beyond its context) against the live server. Fields refused
before the engine sees them: test_translate.py.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
COMPLETION = {"prompt": "hi", "max_tokens": 2}
BODY_LIMIT = 64 * 1024

# -- in-process, over a FakeEngine ---------------------------------------------------------------

DEEP = b'{"prompt": ' + b"[" * 20_000 + b"]" * 20_000 + b"}"  # 40 KB, under the body limit


@pytest.mark.anyio
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
async def test_malformed_json_is_400(route: str, raw: bytes) -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        response = await client.post(
            route, content=raw, headers={"content-type": "application/json"}
        )
    openai_error(response, 400, type="invalid_request_error")
    assert fake.submitted == []


@pytest.mark.anyio
async def test_form_body_is_4xx() -> None:
    async with fake_server() as (client, _):
        response = await client.post("/v1/completions", data={"prompt": "hi"})
    assert 400 <= response.status_code < 500
    openai_error(response, response.status_code)


@pytest.mark.anyio
@pytest.mark.parametrize(
    "path", ["/v1/nothing", "/v2/completions", "/", "/v1/completions/extra", "/v1/models/x"]
)
async def test_unknown_route_is_404(path: str) -> None:
    async with fake_server() as (client, _):
        openai_error(await client.get(path), 404, type="not_found_error")
        openai_error(await client.post(path, json=COMPLETION), 404, type="not_found_error")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("GET", "/v1/completions", {"POST", "OPTIONS"}),
        ("GET", "/v1/chat/completions", {"POST", "OPTIONS"}),
        ("DELETE", "/v1/completions", {"POST", "OPTIONS"}),
        ("PUT", "/v1/chat/completions", {"POST", "OPTIONS"}),
        ("POST", "/v1/models", {"GET", "OPTIONS"}),
        ("POST", "/health", {"GET", "OPTIONS"}),
        ("POST", "/metrics", {"GET", "OPTIONS"}),
    ],
)
async def test_wrong_method_is_405_with_allow(method: str, path: str, allowed: set[str]) -> None:
    async with fake_server() as (client, _):
        response = await client.request(method, path, json=COMPLETION if method != "GET" else None)
    openai_error(response, 405, type="invalid_request_error")
    assert {m.strip() for m in response.headers["allow"].split(",")} == allowed


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["/v1/completions", "/v1/chat/completions"])
async def test_body_over_limit_is_413(route: str) -> None:
    big = "word " * 20_000  # 100 KB, over the 64 KiB limit
    body: dict[str, Any] = (
        {"prompt": big}
        if route == "/v1/completions"
        else {"messages": [{"role": "user", "content": big}]}
    )
    fake = FakeEngine()
    async with fake_server(fake, max_body_bytes=BODY_LIMIT) as (client, _):
        openai_error(await client.post(route, json=body), 413, type="invalid_request_error")
    assert fake.submitted == []


@pytest.mark.anyio
async def test_body_just_under_limit_is_served() -> None:
    fake = FakeEngine()
    async with fake_server(fake, max_body_bytes=BODY_LIMIT) as (client, _):
        body = {"prompt": "word " * 12_000, "max_tokens": 1}  # 60 KB
        response = await client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert len(fake.submitted[0].prompt_ids) == 60_000


# -- against the live server: what only the real engine refuses ---------------------------------

# (route, body, the `param` the error names, or None when any is fine); max_model_len is 1024
ENGINE_REFUSALS = [
    ("/v1/completions", {**COMPLETION, "logit_bias": {"999999999": 1}}, "logit_bias"),
    ("/v1/completions", {**COMPLETION, "stop_token_ids": [10**9]}, "stop_token_ids"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 10**30}, "max_tokens"),
    ("/v1/completions", {"prompt": [10**9]}, "prompt"),
    ("/v1/completions", {"prompt": [-1]}, "prompt"),
    ("/v1/completions", {**COMPLETION, "max_tokens": 1024}, "max_tokens"),
    ("/v1/completions", {"prompt": [5] * 1024, "max_tokens": 1}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 1024}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": None, "max_completion_tokens": 5000}, None),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": [[]]}, "prompt"),
    ("/v1/completions", {"prompt": ["hi", ""]}, "prompt"),
]


@pytest.mark.slow
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(
    ("route", "body", "param"), ENGINE_REFUSALS, ids=[str(i) for i in range(len(ENGINE_REFUSALS))]
)
def test_engine_refusal_is_400(
    http: httpx.Client,
    assert_openai_error: Callable[..., dict[str, Any]],
    route: str,
    body: dict[str, Any],
    param: str | None,
    stream: bool,
) -> None:
    response = http.post(route, json={**body, "stream": True} if stream else body)
    error = assert_openai_error(response, 400)
    assert error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param, error


@pytest.mark.slow
def test_too_long_names_the_numbers(
    http: httpx.Client, assert_openai_error: Callable[..., dict[str, Any]]
) -> None:
    response = http.post("/v1/completions", json={"prompt": [5] * 1000, "max_tokens": 100})
    error = assert_openai_error(response, 400, param="max_tokens")
    assert "1000" in error["message"] and "1024" in error["message"], error


@pytest.mark.slow
def test_errors_leave_the_server_healthy(http: httpx.Client) -> None:
    assert http.get("/health").status_code == 200
    response = http.post("/v1/completions", json={**COMPLETION, "temperature": 0})
    assert response.status_code == 200, response.text
