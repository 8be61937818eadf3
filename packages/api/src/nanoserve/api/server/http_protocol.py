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

from nanoserve.api.server.errors import error_body

MAX_HEAD_BYTES = 16 * 1024  # uvicorn's default, named: a request head past it is a 400
KEEP_ALIVE_S = 5  # uvicorn's default, named: an idle keep-alive connection is closed


class DeadlineProtocol(H11Protocol):
    """H11Protocol with a deadline on reading each request; `read_timeout` None: none.

    After every event (bytes in, a response done) the deadline is kept in step with h11's view
    of the client: reading a request (its head begun but unfinished, or its body) has one,
    started at that request's first byte; anything else has none, and an idle connection
    between requests has uvicorn's keep-alive timer instead."""

    read_timeout: float | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm()  # a new connection: its first request is due

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._keep_in_step()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may start reading a pipelined request
        self._keep_in_step()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a head h11 cannot parse (or too big), in OpenAI's shape."""
        message = f"invalid HTTP request (malformed, or a head over {MAX_HEAD_BYTES} bytes)"
        self._answer_and_close(400, message, None)

    def _reading(self) -> bool:
        """A request is on its way in: a body being read, or bytes of a head (the first
        request of a new connection counts as begun)."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            return True
        return state is h11.IDLE and (bool(self.conn.trailing_data[0]) or self.cycle is None)

    def _keep_in_step(self) -> None:
        if self.transport.is_closing():
            self._disarm()
        elif self._reading():
            if self._read_deadline is None:
                self._arm()  # the first byte of this request
        else:
            self._disarm()
            idle = self.conn.their_state is h11.IDLE and self.conn.our_state is h11.IDLE
            if idle and self.timeout_keep_alive_task is None:
                # Between requests (e.g. after an answer given before its body was read, whose
                # body's end restarted the cycle): keep-alive's timer, as after any response.
                self.timeout_keep_alive_task = self.loop.call_later(
                    self.timeout_keep_alive, self.timeout_keep_alive_handler
                )

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
        if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
            self.transport.close()  # a new connection that never sent a byte: no answer owed
            return
        message = (
            f"the request did not arrive whole within {self.read_timeout:g} s (--read-timeout)"
        )
        self._answer_and_close(408, message, "read_timeout")

    def _answer_and_close(self, status: int, message: str, code: str | None) -> None:
        """OpenAI's error body, and the connection closed; if an answer has already begun (an
        early 413, 415 or 429 while the body still arrives), only the close."""
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = msgspec.json.encode(error_body(status, message, code=code))
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ]
            self.transport.write(self.conn.send(h11.Response(status_code=status, headers=headers)))
            self.transport.write(self.conn.send(h11.Data(data=body)))
            self.transport.write(self.conn.send(h11.EndOfMessage()))
        self.transport.close()


def protocol_class(read_timeout: float | None) -> type[DeadlineProtocol]:
    """The protocol uvicorn.Config(http=...) builds per connection, with this deadline."""
    attrs: dict[str, Any] = {"read_timeout": read_timeout}
    return type("NanoserveHTTPProtocol", (DeadlineProtocol,), attrs)
