"""--api-key: every route but /health wants `Authorization: Bearer KEY`; 401 otherwise."""

from __future__ import annotations

import time
from typing import Any, cast

import pytest
from litestar.testing import TestClient

from nanoserve.api.app import create_app
from nanoserve.api.server.settings import ServerSettings
from nanoserve.api.server.state import ServerState
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error

KEY = "sk-test-0123456789"
ROUTES = [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"prompt": "hi", "max_tokens": 2}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("GET", "/metrics", None),
    ("GET", "/schema/openapi.json", None),
]
WRONG = [
    None,
    f"Bearer {KEY}x",
    f"Bearer {KEY[:-1]}",
    KEY,
    f"bearer{KEY}",
    "Bearer",
    f"Basic {KEY}",
    f"Bearer  {KEY}",
]


@pytest.mark.anyio
@pytest.mark.parametrize("authorization", WRONG, ids=[f"wrong{i}" for i in range(len(WRONG))])
@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
async def test_missing_or_wrong_key_is_401(
    method: str, path: str, body: dict[str, Any] | None, authorization: str | None
) -> None:
    fake = FakeEngine()
    headers = {"authorization": authorization} if authorization is not None else {}
    async with fake_server(fake, api_key=KEY) as (client, _):
        response = await client.request(method, path, json=body, headers=headers)
    openai_error(
        response,
        401,
        type="authentication_error",
        message="a valid API key is required: Authorization: Bearer <key> (or x-api-key: <key>)",
    )
    assert response.headers["www-authenticate"] == "Bearer"
    assert KEY not in response.text
    assert fake.submitted == []


@pytest.mark.anyio
@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
async def test_right_key_is_accepted(method: str, path: str, body: dict[str, Any] | None) -> None:
    async with fake_server(api_key=KEY) as (client, _):
        headers = {"authorization": f"Bearer {KEY}"}
        response = await client.request(method, path, json=body, headers=headers)
    assert response.status_code == 200, response.text


@pytest.mark.anyio
async def test_no_key_configured_means_open() -> None:
    async with fake_server() as (client, _):
        for method, path, body in ROUTES:
            response = await client.request(method, path, json=body)
            assert response.status_code == 200, (path, response.text)


@pytest.mark.anyio
async def test_health_is_public() -> None:
    async with fake_server(api_key=KEY) as (client, _):
        assert (await client.get("/health")).status_code == 200
        bad = await client.get("/health", headers={"authorization": "Bearer nope"})
        assert bad.status_code == 200


@pytest.mark.anyio
async def test_unknown_route_without_key_is_404() -> None:
    # Routing comes first: an unknown path is 404 whether or not a key is sent.
    async with fake_server(api_key=KEY) as (client, _):
        openai_error(await client.get("/v1/nothing"), 404)


def test_openai_client_with_key() -> None:
    """The official client, in-process: its key is sent as the server wants it, and a wrong one
    is its AuthenticationError."""
    import openai

    settings = ServerSettings(api_key=KEY)
    server = ServerState(settings, say=lambda _: None, engine_factory=FakeEngine().factory)
    with TestClient(create_app(settings, server=server)) as http:
        deadline = time.monotonic() + 5
        while server.engine is None:
            assert time.monotonic() < deadline, server.phase
            time.sleep(0.001)
        # Not closed by a `with`: the client would close the test client's transport.
        good = openai.OpenAI(
            base_url=str(http.base_url.join("/v1")),
            api_key=KEY,
            http_client=cast(Any, http),
            max_retries=0,
        )
        assert [m.id for m in good.models.list().data] == ["fake-model"]
        out = good.completions.create(model="fake-model", prompt="hi", max_tokens=3)
        assert out.choices[0].text == "Hel"
        assert out.usage is not None and out.usage.completion_tokens == 3
        bad = openai.OpenAI(
            base_url=str(http.base_url.join("/v1")),
            api_key="wrong",
            http_client=cast(Any, http),
            max_retries=0,
        )
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


@pytest.mark.anyio
async def test_the_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """hmac.compare_digest sees the whole header against the whole expected value, and its
    answer alone decides: a spy that says yes to everything lets a wrong key in (no `==`, no
    early exit on a prefix, before or after it)."""
    import hmac

    calls: list[tuple[bytes, bytes]] = []

    def always_yes(given: bytes, expected: bytes) -> bool:
        calls.append((given, expected))
        return True

    monkeypatch.setattr(hmac, "compare_digest", always_yes)
    async with fake_server(FakeEngine(), api_key=KEY) as (client, _):
        response = await client.get("/v1/models", headers={"authorization": "Bearer nope"})
    assert response.status_code == 200
    # both forms are always compared (Authorization, then Anthropic's x-api-key, here absent)
    assert calls == [(b"Bearer nope", f"Bearer {KEY}".encode()), (b"", KEY.encode())]
