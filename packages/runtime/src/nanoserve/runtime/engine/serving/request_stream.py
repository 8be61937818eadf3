"""RequestStream: one request's deltas as the event loop hands them out, until its n samples end.

The stream is the client's side of a request in AsyncEngine: it stamps each delta's arrival
(`RequestTimes`, for the metrics), counts the samples still running, and on closing — early, or a
cancelled wait — tells its owner, which aborts the request so its blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

from nanoserve.runtime.engine.requests.request_times import RequestTimes
from nanoserve.runtime.engine.step.sequence import Delta


class StreamOwner(Protocol):
    def _closed(self, stream: RequestStream) -> None: ...


class RequestStream:
    """One request's deltas until all n samples finish. Closing it early (or cancelling a
    wait on it) aborts the request, so its blocks are freed at once."""

    def __init__(
        self,
        owner: StreamOwner,
        request_id: str,
        queue: asyncio.Queue[Delta | BaseException],
        n: int,
        times: RequestTimes,
    ) -> None:
        self.owner = owner
        self.request_id = request_id
        self.remaining = n
        self.times = times
        self._queue = queue
        self._closed = False

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> Delta:
        if not self.remaining:
            await self.aclose()
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except BaseException:
            await self.aclose()
            raise
        if isinstance(item, BaseException):
            await self.aclose()
            raise item
        now = time.monotonic()
        if item.token_ids:
            if self.times.first_token is None:
                self.times.first_token = now
            self.times.token_times.append(now)
            self.times.sample_times.setdefault(item.index, []).append(now)
            self.times.completion_tokens += len(item.token_ids)
        if item.finish_reason is not None:
            self.remaining -= 1
            self.times.finish_reasons.append(item.finish_reason)
        return item

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self.owner._closed(self)
