"""The bounded waiting queue: when it is full, 429 with Retry-After, never a 500 or a hang.

The server here holds one row (--max-batch 1) and one waiting request (--max-waiting 1). A long
greedy stream occupies the row; the next request waits; every request after that is refused.
The error's shape, for every route, streamed or not, is test_openai_routes.py's (a FakeEngine
that refuses); the 503 while the model loads is test_app.py's.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

LONG: dict[str, Any] = {
    "prompt": "Once upon a time",
    "max_tokens": 900,
    "temperature": 0,
    "ignore_eos": True,
    "stream": True,
}
SHORT = {"prompt": "hi", "max_tokens": 2, "temperature": 0}
FLOOD = 200
LONGEST = {**LONG, "max_tokens": 1900}  # holds the row through the flood test's five floods


@pytest.fixture(scope="module")
def bounded(start_server: Callable[..., Any]) -> Iterator[Any]:
    live = start_server(
        "--max-batch", "1",
        "--max-waiting", "1",
        "--max-model-len", "2048",
        "--kv-budget", "128MiB",
        "--grace-seconds", "2",
    )  # fmt: skip
    yield live
    code = live.stop()
    assert code == 0, f"exit {code} on SIGTERM:\n{live.log()}"


@pytest.mark.parametrize("stream", [False, True])
def test_n_beyond_the_queue_is_400(
    bounded: Any, assert_openai_error: Callable[..., Any], stream: bool
) -> None:
    """n samples that could never all wait are refused as the client's mistake, before any
    byte of a stream is sent."""
    for route, body in (
        ("/v1/completions", {**SHORT, "n": 2, "stream": stream}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": stream},
        ),
    ):
        response = httpx.post(f"{bounded.url}{route}", json=body, timeout=30)
        assert_openai_error(response, 400, param="n")


@contextmanager
def open_stream(url: str, body: dict[str, Any], *, first_chunk: bool) -> Iterator[httpx.Response]:
    """A streaming completion held open; `first_chunk`: wait until it is running."""
    with (
        httpx.Client(timeout=60) as client,
        client.stream("POST", f"{url}/v1/completions", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        if first_chunk:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data: "))
        yield response


def wait_idle(url: str, metrics_of: Callable[..., dict[str, float]], live: Any) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        m = metrics_of(live)
        idle = (
            m["nanoserve:num_requests_running"] == 0
            and m["nanoserve:num_requests_waiting"] == 0
            and m["nanoserve:kv_cache_usage_perc"] == 0
        )
        if idle:
            return
        time.sleep(0.1)
    pytest.fail(f"server not idle after 30 s: {metrics_of(live)}")


def test_full_queue_is_429_with_retry_after(
    bounded: Any,
    assert_openai_error: Callable[..., dict[str, Any]],
    metrics_of: Callable[..., dict[str, float]],
) -> None:
    url = bounded.url
    with ExitStack() as streams:
        streams.enter_context(open_stream(url, LONG, first_chunk=True))  # holds the row
        streams.enter_context(open_stream(url, LONG, first_chunk=False))  # waits
        m = metrics_of(bounded)
        assert m["nanoserve:num_requests_running"] == 1
        assert m["nanoserve:num_requests_waiting"] == 1
        for route, body in (
            ("/v1/completions", SHORT),
            ("/v1/completions", {**SHORT, "stream": True}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            (
                "/v1/chat/completions",
                {"messages": [{"role": "user", "content": "hi"}], "stream": True},
            ),
        ):
            response = httpx.post(f"{url}{route}", json=body, timeout=30)
            error = assert_openai_error(response, 429, code="queue_full")
            assert error["type"] == "rate_limit_error"
            assert int(response.headers["retry-after"]) >= 1
    # Closing both streams aborted them: the row and the queue are free again.
    wait_idle(url, metrics_of, bounded)
    response = httpx.post(f"{url}/v1/completions", json=SHORT, timeout=60)
    assert response.status_code == 200, response.text


def test_concurrent_burst_is_one_accepted_rest_429(
    bounded: Any, metrics_of: Callable[..., dict[str, float]]
) -> None:
    url = bounded.url
    statuses: list[int] = []
    lock = threading.Lock()

    def fire() -> None:
        response = httpx.post(f"{url}/v1/completions", json=SHORT, timeout=120)
        assert response.status_code != 500, response.text
        if response.status_code == 429:
            assert "retry-after" in response.headers
        with lock:
            statuses.append(response.status_code)

    with open_stream(url, LONG, first_chunk=True):
        threads = [threading.Thread(target=fire) for _ in range(6)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the refusals come back while the row is busy
            with lock:
                if len(statuses) >= 5:
                    break
            time.sleep(0.05)
        with lock:
            early = Counter(statuses)
    # The long stream is closed (aborted): the one accepted request now runs.
    for thread in threads:
        thread.join(timeout=60)
    assert early == Counter({429: 5}), early
    assert Counter(statuses) == Counter({429: 5, 200: 1}), statuses
    wait_idle(url, metrics_of, bounded)


def test_connection_flood_is_429_at_once_and_costs_no_kv(
    bounded: Any,
    metrics_of: Callable[..., dict[str, float]],
    figures: Callable[[str], None],
) -> None:
    """FLOOD requests at once, on as many connections, while the row and the queue are full:
    every one is 429, all of them while the long stream still runs; none is admitted (the
    prompt tokens admitted do not move) and the pool's blocks grow only as the long stream
    does, a block per 16 tokens it generates."""
    url = bounded.url

    def blocks() -> int:
        return httpx.get(f"{url}/health", timeout=30).json()["kv_pool"]["blocks_in_use"]

    async def flood(route: str) -> list[tuple[int, float]]:
        limits = httpx.Limits(max_connections=FLOOD)
        async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:

            async def one(i: int) -> tuple[int, float]:
                started = time.monotonic()
                if route == "/v1/models":
                    response = await http.get(route)
                else:
                    response = await http.post(route, json={**SHORT, "stream": i % 2 == 0})
                return response.status_code, time.monotonic() - started

            return await asyncio.gather(*(one(i) for i in range(FLOOD)))

    def median_ms(answers: list[tuple[int, float]]) -> float:
        return 1000 * sorted(s for _, s in answers)[len(answers) // 2]

    def still_full(before: dict[str, float]) -> None:
        """The row still busy, the one request still waiting, nothing admitted since."""
        now = metrics_of(bounded)
        assert now["nanoserve:num_requests_running"] == 1, now
        assert now["nanoserve:num_requests_waiting"] == 1, now
        assert now["nanoserve:prompt_tokens_total"] == before["nanoserve:prompt_tokens_total"]

    def counted(tokens: float) -> dict[str, float]:
        """The metrics once the engine has taken `tokens` prompt tokens: a request counts as
        waiting once the server accepts it, in prompt_tokens_total only once the engine takes
        it, at its next step (a scrape between the two raced the flood's check)."""
        deadline = time.monotonic() + 30
        while (now := metrics_of(bounded))["nanoserve:prompt_tokens_total"] < tokens:
            assert time.monotonic() < deadline, now
            time.sleep(0.02)
        return now

    base = metrics_of(bounded)["nanoserve:prompt_tokens_total"]
    with ExitStack() as streams:
        streams.enter_context(open_stream(url, LONGEST, first_chunk=True))
        prompt = metrics_of(bounded)["nanoserve:prompt_tokens_total"] - base
        streams.enter_context(open_stream(url, LONG, first_chunk=False))  # the same prompt
        before = counted(base + 2 * prompt)  # the token counts bracket the two block counts
        held = blocks()
        answers = asyncio.run(flood("/v1/completions"))
        grown = blocks() - held
        after = metrics_of(bounded)
        still_full(before)
        # The cost, against the same flood of the lightest route, alternated: 2 rounds.
        ratios = []
        for _ in range(2):
            baseline = asyncio.run(flood("/v1/models"))
            refused = asyncio.run(flood("/v1/completions"))
            still_full(before)
            assert Counter(status for status, _ in baseline) == Counter({200: FLOOD})
            assert Counter(status for status, _ in refused) == Counter({429: FLOOD})
            ratios.append(median_ms(refused) / median_ms(baseline))
    generated = (
        after["nanoserve:generation_tokens_total"] - before["nanoserve:generation_tokens_total"]
    )
    assert Counter(status for status, _ in answers) == Counter({429: FLOOD})
    assert grown <= -(-generated // 16) + 1, (grown, generated)  # a block per 16, and one begun
    wait_idle(url, metrics_of, bounded)
    figures(
        f"flood: {FLOOD} requests at once beyond --max-waiting, a stream running: all 429,"
        f" median {median_ms(answers):.0f} ms; per round, its median over that of the same"
        f" flood of GET /v1/models: {', '.join(f'{r:.2f}' for r in ratios)};"
        f" none admitted; blocks +{grown} as the long stream generated {generated:.0f} tokens"
    )


def test_sigterm_with_a_stream_in_flight(bounded: Any) -> None:
    """Last in this module (it stops the server): SIGTERM while a long stream runs ends the
    stream within the grace period and the process exits 0."""
    lines: list[str] = []
    with (
        httpx.Client(timeout=httpx.Timeout(30)) as client,
        client.stream("POST", f"{bounded.url}/v1/completions", json=LONG) as response,
    ):
        assert response.status_code == 200
        chunks = response.iter_lines()
        lines.append(next(line for line in chunks if line.startswith("data: ")))
        started = time.monotonic()
        bounded.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(httpx.TransportError):  # cut off, or closed cleanly
            lines.extend(line for line in chunks if line)
        ended = time.monotonic() - started
    code = bounded.proc.wait(timeout=30)
    assert code == 0, bounded.log()
    assert ended < 2 + 10, f"the stream outlived the 2 s grace by {ended - 2:.1f} s"
    assert len(lines) < LONG["max_tokens"], "the stream ran to the end instead of stopping"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{bounded.url}/health", timeout=5)
