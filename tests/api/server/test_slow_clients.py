"""Slow and oversized requests against a live server (`--read-timeout 0.5`, tiny model): a
client that trickles its head or its body is answered 408 in OpenAI's shape and cut off, one that
sends nothing is cut off, a head past 16 KiB is a JSON 400; none of it reaches the engine or
stalls anyone else, and a kept-alive connection idle between requests is not mistaken for one.

Socket timeouts here bound a hang (the failure), they do not time the server."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytestmark = pytest.mark.slow

READ_TIMEOUT_S = 0.5
HANG_S = 10.0  # a server that has not cut the client off by then never will


@pytest.fixture(scope="module")
def guarded(start_server: Callable[..., Any], tiny_model_dir: Path) -> Iterator[Any]:
    live = start_server(
        str(tiny_model_dir),
        "--read-timeout", str(READ_TIMEOUT_S),
        "--max-model-len", "256",
        "--kv-budget", "8MiB",
        "--grace-seconds", "2",
    )  # fmt: skip
    yield live
    assert live.stop() == 0, live.log()


def connect(live: Any) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", live.port), timeout=HANG_S)
    return sock


def read_until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends before it closes; a hang fails as socket.timeout."""
    received = b""
    while chunk := sock.recv(65536):
        received += chunk
    return received


def trickle(sock: socket.socket, data: bytes, every_s: float = 0.1) -> None:
    """Send `data` a byte at a time until the server closes the connection."""
    for i in range(len(data)):
        try:
            sock.sendall(data[i : i + 1])
        except OSError:  # reset by the server: cut off, as wanted
            return
        time.sleep(every_s)


def json_answer(raw: bytes, status: int) -> dict[str, Any]:
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    assert lines[0].startswith(f"HTTP/1.1 {status} "), raw[:300]
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    assert headers["content-type"] == "application/json", headers
    assert headers["connection"] == "close", headers
    error = json.loads(body)["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    return error


def admitted(live: Any, metrics_of: Callable[..., dict[str, float]]) -> float:
    return metrics_of(live).get("nanoserve:prompt_tokens_total", 0.0)


def test_slow_head_is_408(guarded: Any, metrics_of: Callable[..., dict[str, float]]) -> None:
    before = admitted(guarded, metrics_of)
    with connect(guarded) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
        trickle(sock, b"x-slow: " + b"a" * 200)
        error = json_answer(read_until_closed(sock), 408)
    assert error == {
        "message": f"the request did not arrive whole within {READ_TIMEOUT_S:g} s (--read-timeout)",
        "type": "timeout_error",
        "param": None,
        "code": "read_timeout",
    }
    assert admitted(guarded, metrics_of) == before


def test_slow_body_is_408(guarded: Any, metrics_of: Callable[..., dict[str, float]]) -> None:
    body = json.dumps({"prompt": "hello world", "max_tokens": 4}).encode()
    before = admitted(guarded, metrics_of)
    with connect(guarded) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body[:5])
        )
        trickle(sock, body[5:])
        error = json_answer(read_until_closed(sock), 408)
    assert error["code"] == "read_timeout"
    assert admitted(guarded, metrics_of) == before  # the engine never saw it
    assert "ERROR" not in guarded.log()  # the client's doing, not a server error
    assert httpx.get(f"{guarded.url}/health", timeout=10).json()["kv_pool"]["blocks_in_use"] == 0


def test_silent_connection_is_closed_without_an_answer(guarded: Any) -> None:
    with connect(guarded) as sock:
        assert read_until_closed(sock) == b""


def test_oversized_head_is_a_json_400(guarded: Any) -> None:
    """A head still unfinished past 16 KiB (h11 bounds the bytes it holds waiting for the rest)."""
    with connect(guarded) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * (17 * 1024))
        error = json_answer(read_until_closed(sock), 400)
    assert error["type"] == "invalid_request_error"
    assert "16384 bytes" in error["message"]


def test_others_are_served_while_slow_clients_hold_connections(guarded: Any) -> None:
    socks = [connect(guarded) for _ in range(8)]
    try:
        for sock in socks:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n")
        response = httpx.post(
            f"{guarded.url}/v1/completions",
            json={"prompt": "hello", "max_tokens": 4, "temperature": 0},
            timeout=HANG_S,
        )
        assert response.status_code == 200, response.text
        for sock in socks:  # and each slow one is cut off in its turn
            json_answer(read_until_closed(sock), 408)
    finally:
        for sock in socks:
            sock.close()


def test_a_kept_alive_connection_is_not_cut_off_between_requests(guarded: Any) -> None:
    """The deadline is on reading a request, not on the idle time between two requests of one
    connection (that is the keep-alive timeout's, 5 s); that a long answer is not cut off is
    test_http_protocol.py's (no deadline once a request is read whole)."""
    body = {"prompt": "hello", "max_tokens": 8, "temperature": 0}
    with httpx.Client(base_url=guarded.url, timeout=HANG_S) as client:
        first = client.post("/v1/completions", json=body)
        time.sleep(3 * READ_TIMEOUT_S)
        second = client.post("/v1/completions", json=body)
        streamed = client.post("/v1/completions", json={**body, "stream": True})
    assert first.status_code == second.status_code == streamed.status_code == 200
    assert streamed.text.rstrip().endswith("data: [DONE]")
