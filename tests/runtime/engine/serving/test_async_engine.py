"""AsyncEngine: streams of deltas beside an event loop; forwards on a worker thread.

Each test runs its own event loop with `asyncio.run`, and shuts the engine down before it ends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import pytest

from nanoserve.runtime.engine.engine import Engine, RequestError
from nanoserve.runtime.engine.requests.request_times import RequestTimes
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.serving.async_engine import (
    AsyncEngine,
    EngineClosedError,
    EngineDeadError,
    StreamBehindError,
)
from nanoserve.runtime.engine.step.scheduler import QueueFullError
from nanoserve.runtime.engine.step.sequence import Delta

T = TypeVar("T")

pytestmark = pytest.mark.usefixtures("single_torch_thread")

PROMPTS = [tuple(range(10 + i, 10 + i + 3 * i + 2)) for i in range(8)]  # 2 .. 23 tokens


def greedy(max_tokens: int, **kwargs: object) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kwargs)  # type: ignore[arg-type]


def sync_tokens(make_tiny_engine, prompt: tuple[int, ...], params: SamplingParams) -> list[int]:
    engine = make_tiny_engine()
    engine.add_request("ref", prompt, params)
    deltas = [engine.step() for _ in range(params.max_tokens + 1)]  # prefill + decodes: done
    assert not engine.has_unfinished
    return [t for step in deltas for d in step for t in d.token_ids]


def run(engine: Engine, body: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    async def main() -> T:
        served = AsyncEngine(engine)
        await served.start()
        try:
            return await asyncio.wait_for(body(served), timeout=30)
        finally:
            await served.shutdown(grace_seconds=0.0)

    return asyncio.run(main())


async def until_idle(engine: Engine, timeout: float = 10.0) -> None:
    async def wait() -> None:
        while engine.has_unfinished or engine.blocks.num_in_use:
            await asyncio.sleep(0.005)

    await asyncio.wait_for(wait(), timeout)


async def collect(stream: AsyncIterator[Delta]) -> list[Delta]:
    return [delta async for delta in stream]


def test_deltas_stream_in_order(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    expected = sync_tokens(make_tiny_engine, PROMPTS[5], greedy(12))

    async def body(served: AsyncEngine) -> list[Delta]:
        return await collect(served.submit("a", PROMPTS[5], greedy(12)))

    deltas = run(engine, body)
    assert [t for d in deltas for t in d.token_ids] == expected
    assert [d.completion_tokens for d in deltas] == list(range(1, 13))  # one token a step
    assert [d.finish_reason for d in deltas] == [None] * 11 + ["length"]
    assert all(d.request_id == "a" and d.prompt_tokens == len(PROMPTS[5]) for d in deltas)
    assert engine.blocks.num_in_use == 0


def test_concurrent_streams_match_the_sync_engine(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    params = [greedy(4 + 3 * i) for i in range(8)]
    expected = [sync_tokens(make_tiny_engine, p, q) for p, q in zip(PROMPTS, params, strict=True)]

    async def body(served: AsyncEngine) -> list[list[Delta]]:
        streams = [served.submit(f"r{i}", PROMPTS[i], params[i]) for i in range(8)]
        return await asyncio.gather(*(collect(s) for s in streams))

    results = run(engine, body)
    assert [[t for d in deltas for t in d.token_ids] for deltas in results] == expected
    assert engine.status().finished == {"length": 8}


def test_forwards_never_run_on_the_event_loop_thread(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    threads: list[int] = []
    forward = engine.model.forward

    def recording_forward(*args, **kwargs):
        threads.append(threading.get_ident())
        return forward(*args, **kwargs)

    engine.model.forward = recording_forward

    async def body(served: AsyncEngine) -> int:
        loop_thread = threading.get_ident()
        streams = [served.submit(f"r{i}", PROMPTS[i], greedy(5)) for i in range(3)]
        await asyncio.gather(*(collect(s) for s in streams))
        return loop_thread

    loop_thread = run(engine, body)
    assert len(threads) >= 5  # a prefill and four decodes at least
    assert loop_thread not in threads


def test_the_loop_stays_responsive_during_steps(make_tiny_engine) -> None:
    """While the engine steps, the event loop keeps ticking (the steps are not on it)."""
    engine = make_tiny_engine()
    forward = engine.model.forward

    def slow_forward(*args, **kwargs):
        threading.Event().wait(0.02)  # a forward that takes a while, off the loop
        return forward(*args, **kwargs)

    engine.model.forward = slow_forward

    async def body(served: AsyncEngine) -> int:
        ticks = 0
        task = asyncio.ensure_future(collect(served.submit("a", PROMPTS[1], greedy(6))))
        while not task.done():
            await asyncio.sleep(0.001)
            ticks += 1
        await task
        return ticks

    assert run(engine, body) > 20  # six 20 ms forwards: the loop ticked throughout


def test_closing_a_stream_early_aborts_and_frees_blocks(make_tiny_engine) -> None:
    engine = make_tiny_engine()

    async def body(served: AsyncEngine) -> list[Delta]:
        stream = served.submit("long", PROMPTS[7], greedy(90))
        got = [await stream.__anext__() for _ in range(3)]
        assert engine.blocks.num_in_use > 0
        await stream.aclose()
        await until_idle(engine)
        assert served.num_in_flight == 0
        return got

    got = run(engine, body)
    assert len(got) == 3
    assert engine.status().finished == {"abort": 1}
    engine.check_blocks()
    assert engine.blocks.num_in_use == 0


def test_cancelling_a_consumer_aborts_the_request(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    forward = engine.model.forward

    def slow_forward(*args, **kwargs):
        threading.Event().wait(0.005)  # 90 tokens take ~0.5 s: the cancel lands mid-stream
        return forward(*args, **kwargs)

    engine.model.forward = slow_forward

    async def body(served: AsyncEngine) -> None:
        stream = served.submit("long", PROMPTS[6], greedy(90))
        first = await stream.__anext__()
        assert first.token_ids
        consumer = asyncio.ensure_future(collect(stream))
        await asyncio.sleep(0.01)
        consumer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await consumer
        await until_idle(engine)
        other = await collect(served.submit("after", PROMPTS[0], greedy(3)))  # still serving
        assert other[-1].finish_reason == "length"

    run(engine, body)
    assert engine.status().finished == {"abort": 1, "length": 1}
    assert engine.blocks.num_in_use == 0


def test_queue_bound(make_tiny_engine) -> None:
    engine = make_tiny_engine(max_waiting=2)

    async def body(served: AsyncEngine) -> None:
        # Three submits with no await between them: none has reached the engine yet.
        first = served.submit("a", PROMPTS[1], greedy(3))
        second = served.submit("b", PROMPTS[2], greedy(3))
        assert served.num_pending == 2
        with pytest.raises(QueueFullError):
            served.submit("c", PROMPTS[3], greedy(3))
        assert served.num_in_flight == 2  # the refused one holds no stream
        await collect(first)
        await collect(second)
        await collect(served.submit("c", PROMPTS[3], greedy(3)))  # room again

    run(engine, body)
    assert engine.status().finished == {"length": 3}


def test_bad_requests_raise_at_submit(make_tiny_engine) -> None:
    engine = make_tiny_engine()

    async def body(served: AsyncEngine) -> None:
        with pytest.raises(RequestError) as caught:
            served.submit("e", (), greedy(3))
        assert caught.value.field == "prompt"
        with pytest.raises(RequestError) as caught:
            served.submit("v", (5, 999), greedy(3))
        assert caught.value.field == "prompt"
        with pytest.raises(RequestError) as caught:
            served.submit("m", (5,) * 100, greedy(100))
        assert caught.value.field == "max_tokens"
        assert served.num_in_flight == 0

    run(engine, body)
    assert not engine.has_unfinished


class RefusingEngine:
    """An engine whose add_request fails where only the step thread can see it (after the
    event loop's own checks passed), once `go` is set; everything else is the real engine's."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self.go = threading.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._engine, name)

    def add_request(self, *args: object) -> None:
        self.go.wait(timeout=10)
        raise RequestError("prompt", "refused on the step thread")


def test_a_refusal_on_the_step_thread_reaches_its_stream_through_the_loop(
    make_tiny_engine,
) -> None:
    """asyncio's queues are not thread-safe: the step thread hands the refusal back, and the
    event loop puts it on the stream. Under a debug loop, a put from the step thread to a
    consumer already waiting raises "Non-thread-safe operation" there: the engine dies, and the
    consumer is never woken. The loop is run by hand, so a stuck consumer fails the test
    instead of hanging asyncio.run's teardown."""
    engine = make_tiny_engine()
    refusing = RefusingEngine(engine)

    async def main() -> tuple[BaseException | str | None, str | None]:
        served = AsyncEngine(refusing)  # type: ignore[arg-type]
        await served.start()
        try:
            consumer = asyncio.create_task(collect(served.submit("r", PROMPTS[2], greedy(3))))
            for _ in range(3):  # the consumer runs, and waits on its empty stream
                await asyncio.sleep(0)
            refusing.go.set()
            done, _ = await asyncio.wait({consumer}, timeout=10)
            return (consumer.exception() if done else "stuck"), served.dead
        finally:
            await served.shutdown(grace_seconds=0.0)

    loop = asyncio.new_event_loop()
    loop.set_debug(True)
    try:
        outcome, dead = loop.run_until_complete(main())
    finally:
        loop.close()
    assert isinstance(outcome, RequestError) and "refused on the step thread" in str(outcome)
    assert dead is None


def test_n_samples_stream_until_all_finish(make_tiny_engine) -> None:
    engine = make_tiny_engine()

    async def body(served: AsyncEngine) -> list[Delta]:
        return await collect(served.submit("n", PROMPTS[4], greedy(5, n=2)))

    deltas = run(engine, body)
    assert sorted(d.index for d in deltas if d.finish_reason) == [0, 1]
    per_index = {i: [t for d in deltas if d.index == i for t in d.token_ids] for i in (0, 1)}
    assert per_index[0] == per_index[1] == sync_tokens(make_tiny_engine, PROMPTS[4], greedy(5))


def test_shutdown_aborts_in_flight_and_refuses_new(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    forward = engine.model.forward

    def slow_forward(*args, **kwargs):
        threading.Event().wait(0.01)  # 90 tokens take ~1 s: far past the grace below
        return forward(*args, **kwargs)

    engine.model.forward = slow_forward

    async def main() -> None:
        served = AsyncEngine(engine)
        with pytest.raises(EngineDeadError):
            served.submit("early", PROMPTS[0], greedy(2))  # not started
        await served.start()
        stream = served.submit("long", PROMPTS[7], greedy(90))
        await stream.__anext__()
        consumer = asyncio.ensure_future(collect(stream))
        await served.shutdown(grace_seconds=0.05)
        with pytest.raises(EngineClosedError):
            served.submit("late", PROMPTS[0], greedy(2))
        rest = await consumer
        assert rest[-1].finish_reason == "abort"
        assert 1 + sum(len(d.token_ids) for d in rest) < 90

    asyncio.run(main())
    assert not engine.has_unfinished
    engine.check_blocks()
    assert engine.blocks.num_in_use == 0


def test_observer_sees_each_request_once(make_tiny_engine) -> None:
    engine = make_tiny_engine()
    seen: list[RequestTimes] = []

    async def body(served: AsyncEngine) -> None:
        served.observer = seen.append
        await collect(served.submit("a", PROMPTS[3], greedy(4)))

    run(engine, body)
    [times] = seen
    assert times.completion_tokens == 4
    assert times.finish_reasons == ["length"]
    assert times.ttft is not None and times.ttft >= 0
    assert len(times.inter_token()) == 3


def test_a_client_that_never_reads_is_aborted_and_its_blocks_freed(make_tiny_engine) -> None:
    engine = make_tiny_engine()

    async def main() -> list[Delta | BaseException]:
        served = AsyncEngine(engine, max_behind=5)
        await served.start()
        stream = served.submit("unread", PROMPTS[3], greedy(60))
        other = served.submit("read", PROMPTS[1], greedy(20))
        read = await collect(other)  # a reader beside it is served whole
        assert sum(len(d.token_ids) for d in read) == 20
        deadline = time.monotonic() + 10
        while engine.has_unfinished and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        assert not engine.has_unfinished and engine.blocks.num_in_use == 0
        items: list[Delta | BaseException] = []
        try:
            async for delta in stream:
                items.append(delta)
        except StreamBehindError as error:
            items.append(error)
        await served.shutdown(grace_seconds=0.1)
        return items

    items = asyncio.run(main())
    assert len(items) == 6 and isinstance(items[-1], StreamBehindError)
    assert "fell more than 5 tokens behind" in str(items[-1])
    assert sum(len(d.token_ids) for d in items[:-1] if isinstance(d, Delta)) < 60


def test_shutdown_ends_a_loop_that_swallowed_its_cancel(make_tiny_engine, monkeypatch) -> None:
    """Python 3.11's wait_for returns the step's result, dropping a cancel that arrives as the
    step completes; the loop then stepped on and waited for work forever, and the shutdown with
    it (a server that did not exit after SIGTERM). Here every step swallows cancels that way,
    and the engine holds a request no stream waits for, so the shutdown meets a step in flight."""
    engine = make_tiny_engine()
    real_wait_for = asyncio.wait_for
    swallowed: list[bool] = []

    async def swallowing_wait_for(future: Awaitable[T], timeout: float | None) -> T:
        inner = asyncio.ensure_future(future)
        try:
            return await real_wait_for(asyncio.shield(inner), timeout)
        except asyncio.CancelledError:
            swallowed.append(True)
            return await inner  # the step ran on: its result, and the cancel is lost

    monkeypatch.setattr(
        "nanoserve.runtime.engine.serving.async_engine.asyncio.wait_for", swallowing_wait_for
    )
    forward = engine.model.forward

    def slow_forward(*args, **kwargs):
        threading.Event().wait(0.05)  # 100 tokens: 5 s
        return forward(*args, **kwargs)

    engine.model.forward = slow_forward
    engine.add_request("unwatched", PROMPTS[7], greedy(100))

    async def main() -> float:
        served = AsyncEngine(engine)
        await served.start()
        await asyncio.sleep(0.3)  # a few steps in
        started = time.monotonic()
        await asyncio.wait_for(served.shutdown(grace_seconds=0.0), timeout=20)
        return time.monotonic() - started

    assert asyncio.run(main()) < 1.0  # one step's return, not the request's 5 s (or forever)
    assert engine.num_steps < 20
