"""The HTTP/1.1 protocol `nanoserve serve` speaks: uvicorn's h11 one, plus a read deadline.

uvicorn bounds a request head's size (`h11_max_incomplete_event_size`: a bigger head is a 400)
and an idle keep-alive connection (`timeout_keep_alive`), but not the time a client may take to
send its request: one that trickles its head or its body a byte at a time holds a connection,
and the body's buffer, for as long as it likes (a slowloris). Here a request must arrive whole,
head and body, within `read_timeout` seconds of its first byte (of the connection's opening,
for a new connection). Past that, a client that has sent something gets 408 in OpenAI's error
shape, one that has sent nothing gets nothing, and the connection is closed. The app has not
begun on such a request (Litestar reads a body whole before its handler runs), so no engine
work or K/V block is spent on it.

uvicorn's own refusal of a malformed or oversized head is a text/plain 400; here it is JSON.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
import msgspec
from uvicorn.protocols.http.h11_impl import H11Protocol

from nanoserve.api.errors import error_body

MAX_HEAD_BYTES = 16 * 1024  # uvicorn's default, named: a request head past it is a 400
KEEP_ALIVE_S = 5  # uvicorn's default, named: an idle keep-alive connection is closed


class DeadlineProtocol(H11Protocol):
    """H11Protocol with a deadline on reading each request; `read_timeout` None: none."""

    read_timeout: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if self._read_deadline is None and self.conn.their_state is h11.IDLE:
            self._arm()  # the first byte of the connection's next request
        super().data_received(data)
        if self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
            self._disarm()  # read whole (DONE), or refused (ERROR), or the client closed

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a head h11 cannot parse (or too big), in OpenAI's shape."""
        message = f"invalid HTTP request (malformed, or a head over {MAX_HEAD_BYTES} bytes)"
        body = msgspec.json.encode(error_body(400, message))
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        self.transport.write(self.conn.send(h11.Response(status_code=400, headers=headers)))
        self.transport.write(self.conn.send(h11.Data(data=body)))
        self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()

    def _arm(self) -> None:
        if self.read_timeout is not None:
            self._read_deadline = self.loop.call_later(self.read_timeout, self._expire)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _expire(self) -> None:
        self._read_deadline = None
        if self.transport.is_closing():
            return
        sent_nothing = self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]
        answering = self.cycle is not None and self.cycle.response_started
        if not (sent_nothing or answering):
            message = (
                f"the request did not arrive whole within {self.read_timeout:g} s (--read-timeout)"
            )
            body = msgspec.json.encode(error_body(408, message, code="read_timeout"))
            # Raw bytes: h11 will not answer a request whose head it has not yet read.
            self.transport.write(
                b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(body), body)
            )
        self.transport.close()


def protocol_class(read_timeout: float | None) -> type[DeadlineProtocol]:
    """The protocol uvicorn.Config(http=...) builds per connection, with this deadline."""
    attrs: dict[str, Any] = {"read_timeout": read_timeout}
    return type("NanoserveHTTPProtocol", (DeadlineProtocol,), attrs)
