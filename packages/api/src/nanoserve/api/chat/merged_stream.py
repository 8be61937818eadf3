"""MergedStream: several engine requests' deltas as one stream, for one HTTP answer.

Each request was validated and queued when submitted, so refusals surface before any byte is
sent. Closing the merged stream (a client gone) closes every engine stream, which aborts the
requests and frees their blocks at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Sequence

from litestar import Request

from nanoserve.api.chat.engine_inputs import ChatInputs
from nanoserve.api.server.engine_client import DeltaStream, EngineClient
from nanoserve.api.server.errors import APIError
from nanoserve.runtime import Delta, PoolingParams, SamplingParams


class MergedStream:
    """Deltas of several engine requests as one stream. Each was validated and queued when
    submitted, so refusals (a full queue, a bad prompt) surfaced before any byte was sent."""

    def __init__(self, streams: list[DeltaStream], timeout: float | None = None) -> None:
        self._streams = streams
        # --request-timeout: past it the answer is an error and the requests are aborted.
        self._deadline = None if timeout is None else time.monotonic() + timeout
        self._timeout = timeout
        self._queue: asyncio.Queue[tuple[int, Delta] | BaseException | None] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []
        self._live = len(streams)

    @classmethod
    async def submit(
        cls,
        engine: EngineClient,
        requests: Sequence[tuple[str, Sequence[int]]],
        params: SamplingParams | PoolingParams,
        *,
        timeout: float | None = None,
    ) -> MergedStream:
        """Submit every (request id, prompt ids) and start merging. A refusal of any (a full
        queue, a bad prompt) closes those already submitted, so none is left running."""
        streams: list[DeltaStream] = []
        try:
            for request_id, prompt_ids in requests:
                streams.append(engine.submit(request_id, prompt_ids, params))
        except BaseException:
            for stream in streams:
                await stream.aclose()
            raise
        merged = cls(streams, timeout)
        merged.start()
        return merged

    def start(self) -> None:
        for index, stream in enumerate(self._streams):
            self._tasks.append(asyncio.create_task(self._pump(index, stream)))

    async def _pump(self, index: int, stream: DeltaStream) -> None:
        try:
            async for delta in stream:
                self._queue.put_nowait((index, delta))
        except BaseException as error:
            self._queue.put_nowait(error)
        finally:
            self._queue.put_nowait(None)

    async def __aiter__(self) -> AsyncIterator[tuple[int, Delta]]:
        live = self._live
        while live:
            item = await self._next()
            if item is None:
                live -= 1
                continue
            if isinstance(item, BaseException):
                raise item
            yield item

    async def _next(self) -> tuple[int, Delta] | BaseException | None:
        if self._deadline is None:
            return await self._queue.get()
        try:
            return await asyncio.wait_for(
                self._queue.get(), timeout=max(0.0, self._deadline - time.monotonic())
            )
        except TimeoutError:
            raise APIError(
                408,
                f"the request ran past the server's --request-timeout of {self._timeout:g} s",
                code="request_timeout",
            ) from None

    async def drain(self, request: Request) -> list[tuple[int, Delta]]:
        """Every delta, for a non-streamed answer. A client that disconnects first aborts the
        requests at once, rather than leaving them to run to max_tokens for nobody."""

        async def collect() -> list[tuple[int, Delta]]:
            return [item async for item in self]

        work = asyncio.create_task(collect())
        gone = asyncio.create_task(_disconnected(request))
        try:
            await asyncio.wait((work, gone), return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                raise APIError(499, "the client closed the connection")
            return work.result()
        finally:
            for task in (work, gone):
                task.cancel()
            await asyncio.wait((work, gone))
            await self.close()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        for stream in self._streams:
            await stream.aclose()


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (the body was read already: only a disconnect is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def submit_chat(
    engine: EngineClient, request_id: str, inputs: ChatInputs, timeout: float | None
) -> MergedStream:
    """Compile its grammar (off the event loop), then submit the request: every refusal comes
    before the first byte of an answer."""
    if inputs.params.grammar is not None:
        await engine.compile_grammar(inputs.params.grammar)
    return await MergedStream.submit(
        engine, [(request_id, inputs.prompt_ids)], inputs.params, timeout=timeout
    )
