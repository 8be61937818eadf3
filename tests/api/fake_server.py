"""The app in-process over a FakeEngine: `fake_server(...)` yields a booted AsyncTestClient.

No socket, no model: the lifespan and its boot thread run as in production, the engine factory
hands out the fake. Also the checks every API test shares: OpenAI's error body, SSE frames.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from litestar.testing import AsyncTestClient

from nanoserve.api.app import create_app
from nanoserve.api.server.engine_client import EngineFactory
from nanoserve.api.server.settings import ServerSettings
from nanoserve.api.server.state import ServerState
from tests.api.fake_engine import FakeEngine

BOOT_TIMEOUT_S = 5.0


@asynccontextmanager
async def fake_server(
    fake: FakeEngine | None = None,
    *,
    factory: EngineFactory | None = None,
    wait: bool = True,
    **settings: Any,
) -> AsyncIterator[tuple[AsyncTestClient, ServerState]]:
    """A client of an app whose engine is `fake` (or what `factory` builds); `settings` are
    ServerSettings' own fields (api_key, max_body_bytes, grace_seconds). `wait`: until the boot
    has ended (ready, failed or stopped)."""
    fake = fake if fake is not None else FakeEngine()
    config = ServerSettings(**settings)
    server = ServerState(config, say=lambda _: None, engine_factory=factory or fake.factory)
    async with AsyncTestClient(create_app(config, server=server)) as client:
        if wait:
            await booted(server)
        yield client, server


async def booted(server: ServerState) -> None:
    deadline = time.monotonic() + BOOT_TIMEOUT_S
    while server.engine is None and server.boot_error is None and server.phase != "stopped":
        assert time.monotonic() < deadline, f"boot still at {server.phase!r}"
        await asyncio.sleep(0.001)


def openai_error(response: httpx.Response, status: int, **expected: object) -> dict[str, Any]:
    """The status, and OpenAI's error body: exactly {error: {message, type, param, code}}."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.headers
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str | int), error
    for key, value in expected.items():
        assert error[key] == value, (key, error)
    return error


def sse_data(response: httpx.Response) -> list[str]:
    """The `data:` payloads of an SSE body, checking its framing: every event is one
    `data: ...` line ended by a blank line (CRLF, as Litestar writes them), and nothing else."""
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream"), response.headers
    text = response.text
    assert text.endswith("\r\n\r\n"), text[-40:]
    events = text.removesuffix("\r\n\r\n").split("\r\n\r\n")
    assert all(e.startswith("data: ") and "\r\n" not in e for e in events), events
    return [e.removeprefix("data: ") for e in events]


def sse_chunks(response: httpx.Response) -> list[dict[str, Any]]:
    """The JSON chunks of an SSE body, which must end with `data: [DONE]`."""
    data = sse_data(response)
    assert data[-1] == "[DONE]", data[-3:]
    return [json.loads(d) for d in data[:-1]]
