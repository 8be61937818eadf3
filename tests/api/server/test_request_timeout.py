"""--request-timeout: a request past its deadline ends with OpenAI's error (a 408, or a stream's
last event), and its engine requests are closed, so their blocks are freed."""

from __future__ import annotations

import time
from typing import Any

import pytest

from nanoserve.api.server.settings import ServerSettings, parse_seconds
from nanoserve.core.errors import NanoserveError
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error, sse_chunks

pytestmark = pytest.mark.anyio


HI = [{"role": "user", "content": "Hi"}]
ROUTES = [
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 40}),
    ("/v1/chat/completions", {"messages": HI}),
]
SLOW: dict[str, Any] = {"replies": ("a" * 40,), "step_seconds": 0.02}  # 40 deltas: 0.8 s


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_past_the_deadline_is_408_and_the_requests_are_closed(path: str, body: dict) -> None:
    fake = FakeEngine(**SLOW)
    async with fake_server(fake, request_timeout=0.1) as (client, _):
        response = await client.post(path, json=body)
    error = openai_error(response, 408, code="request_timeout", type="timeout_error")
    assert "0.1 s" in error["message"]
    assert fake.closed == [s.request_id for s in fake.submitted]  # aborted: blocks freed


@pytest.mark.parametrize(("path", "body"), ROUTES)
async def test_a_stream_past_the_deadline_ends_with_the_error(path: str, body: dict) -> None:
    fake = FakeEngine(**SLOW)
    async with fake_server(fake, request_timeout=0.1) as (client, _):
        response = await client.post(path, json={**body, "stream": True})
    chunks = sse_chunks(response)  # still ends with [DONE]
    assert chunks[-1]["error"]["code"] == "request_timeout"
    assert set(chunks[-1]) == {"error"}
    assert 1 < len(chunks) < 40  # some tokens went out first
    assert fake.closed == [s.request_id for s in fake.submitted]


async def test_within_the_deadline_nothing_changes() -> None:
    fake = FakeEngine(replies=("abc",), step_seconds=0.001)
    async with fake_server(fake, request_timeout=5) as (client, _):
        response = await client.post("/v1/completions", json={"prompt": "Hi"})
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == "abc"


def test_the_flag_parses() -> None:
    assert parse_seconds("2.5") == 2.5
    assert parse_seconds("off") is None and parse_seconds("0") is None
    for bad in ("-1", "soon", "inf"):
        with pytest.raises(NanoserveError):
            parse_seconds(bad)
    settings = ServerSettings.from_values({"request_timeout": 3.0})
    assert settings.request_timeout == 3.0 and ServerSettings().request_timeout is None


@pytest.fixture(scope="module")
def deadline_server(start_server):
    live = start_server(
        "--request-timeout", "2",
        "--max-batch", "2",
        "--max-model-len", "1024",
        "--kv-budget", "64MiB",
        "--grace-seconds", "2",
    )  # fmt: skip
    yield live
    assert live.stop() == 0, live.log()


LONG = {"prompt": "Once upon a time", "max_tokens": 900, "temperature": 0, "ignore_eos": True}


def blocks_in_use(live) -> int:
    import httpx

    return httpx.get(f"{live.url}/health", timeout=10).json()["kv_pool"]["blocks_in_use"]


@pytest.mark.slow
@pytest.mark.anyio(False)  # a live server, over a socket
@pytest.mark.parametrize("stream", [False, True])
def test_a_live_request_past_the_deadline_frees_its_blocks(deadline_server, stream: bool) -> None:
    import httpx

    with httpx.Client(base_url=deadline_server.url, timeout=30) as http:
        response = http.post("/v1/completions", json={**LONG, "stream": stream})
        if stream:
            assert response.status_code == 200
            data = [line for line in response.text.splitlines() if line.startswith("data: ")]
            assert data[-1] == "data: [DONE]"
            last = data[-2]
            assert '"request_timeout"' in last, response.text[-300:]
        else:
            openai_error(response, 408, code="request_timeout")
        answer = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 4})
        assert answer.status_code == 200  # the server goes on
    deadline = time.monotonic() + 5
    while blocks_in_use(deadline_server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert blocks_in_use(deadline_server) == 0
