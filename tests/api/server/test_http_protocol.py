"""The read deadline's bookkeeping, step by step, on one connection in-process: bytes fed to the
protocol as a socket would, a transport that records what is written, and the timer's firing
called by hand. Which request has a deadline, when it starts, and what the client is told
(the live cases, with real sockets and clocks, are test_slow_clients.py's)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from nanoserve.api.server.http_protocol import DeadlineProtocol, protocol_class

pytestmark = pytest.mark.anyio


class RecordingTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default
        )

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the body whole, then answers 200; `/early` answers 415 before reading it."""
    if scope["path"] != "/early":
        while (await receive()).get("more_body"):
            pass
    status = 415 if scope["path"] == "/early" else 200
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


async def connection(
    read_timeout: float | None = 30.0,
) -> tuple[DeadlineProtocol, RecordingTransport]:
    http = protocol_class(read_timeout)
    config = uvicorn.Config(app=app, http=http, log_level="warning")
    config.load()
    proto = http(
        config=config, server_state=ServerState(), app_state={}, _loop=asyncio.get_running_loop()
    )
    transport = RecordingTransport()
    proto.connection_made(transport)
    return proto, transport


async def settle() -> None:
    for _ in range(20):  # the app's task: a few loop turns
        await asyncio.sleep(0)


def post(path: str, body: bytes, *, sent: int | None = None) -> bytes:
    head = b"POST %s HTTP/1.1\r\nhost: x\r\ncontent-length: %d\r\n\r\n" % (path.encode(), len(body))
    return head + body[:sent]


async def test_a_new_connection_is_due_its_first_request() -> None:
    proto, transport = await connection()
    assert proto._read_deadline is not None
    proto._expire()  # nothing came: closed, nothing said
    assert transport.closed and transport.written == b""


async def test_a_request_read_whole_has_no_deadline_while_it_is_answered() -> None:
    proto, transport = await connection()
    proto.data_received(b"GET /a HTTP/1.1\r\nhost: x\r\n")
    assert proto._read_deadline is not None  # the head is unfinished
    proto.data_received(b"\r\n")
    assert proto._read_deadline is None  # read whole: however long the answer takes
    await settle()
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    # Between requests: uvicorn's keep-alive timer, not the read deadline.
    assert proto._read_deadline is None and proto.timeout_keep_alive_task is not None


async def test_the_next_request_on_a_kept_alive_connection_gets_its_own_deadline() -> None:
    proto, transport = await connection()
    proto.data_received(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n")
    await settle()
    proto.data_received(b"GET /b HTTP/1.1\r\n")
    first = proto._read_deadline
    assert first is not None and proto.timeout_keep_alive_task is None
    proto.data_received(b"x-more: 1\r\n")
    assert proto._read_deadline is first  # from the request's first byte, not its last
    transport.written.clear()
    proto._expire()
    assert transport.written.startswith(b"HTTP/1.1 408 ")
    error = json.loads(bytes(transport.written).partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "read_timeout" and error["type"] == "timeout_error"
    assert transport.closed


async def test_a_pipelined_request_is_held_to_the_deadline() -> None:
    """A whole GET and the start of a POST in one write: once the GET is answered, the POST's
    body is being read, and has a deadline."""
    proto, transport = await connection()
    proto.data_received(b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n" + post("/b", b"x" * 100, sent=3))
    assert proto._read_deadline is None  # the GET is read whole; the POST waits its turn
    await settle()
    assert transport.written.startswith(b"HTTP/1.1 200 ")
    assert proto._read_deadline is not None  # now the POST's body is due
    transport.written.clear()
    proto._expire()
    assert transport.written.startswith(b"HTTP/1.1 408 ") and transport.closed


async def test_an_answer_given_before_the_body_leaves_no_stale_deadline() -> None:
    """An early answer (as 415 or 429 are, before the body is read): the body's deadline runs
    until it has arrived, then the connection is idle, on keep-alive's timer, and the next
    request starts a deadline of its own."""
    proto, transport = await connection()
    proto.data_received(post("/early", b"x" * 10, sent=4))
    await settle()
    assert transport.written.startswith(b"HTTP/1.1 415 ")
    first = proto._read_deadline
    assert first is not None  # the rest of the body is still due
    proto.data_received(b"x" * 6)
    assert proto._read_deadline is None and proto.timeout_keep_alive_task is not None
    proto.data_received(b"GET /a HTTP/1.1\r\n")
    assert proto._read_deadline is not None and proto._read_deadline is not first


async def test_an_answer_already_begun_is_not_followed_by_a_408() -> None:
    proto, transport = await connection()
    proto.data_received(post("/early", b"x" * 10, sent=4))
    await settle()
    answered = bytes(transport.written)
    proto._expire()  # the body never came
    assert transport.written == answered and transport.closed


async def test_no_read_timeout_means_no_deadline() -> None:
    proto, _ = await connection(read_timeout=None)
    proto.data_received(b"GET /a HTTP/1.1\r\n")
    assert proto._read_deadline is None
