"""AsyncEngine: the engine's step loop beside an event loop, for the server.

Forwards run on one step thread of their own, never on the event loop. Requests and
aborts arrive through an inbox (typed messages: `AddRequest`, `AbortRequest`) that the step
thread drains between steps, so the event loop never waits for a step to finish. Each request
gets an async iterator of deltas (`RequestStream`, request_stream.py); cancelling it aborts the
request and frees its blocks.

This class is the whole surface the server uses: `name`, `max_model_len`, `tokenizer`,
`render_chat`, `template_reads_tools`, `default_max_tokens`, `compile_grammar`, `submit`,
`status`, `num_pending`, `start`, `shutdown`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, NamedTuple

from nanoserve.core.errors import NanoserveError
from nanoserve.runtime.engine.boot.boot_heap import thaw_boot_heap
from nanoserve.runtime.engine.engine import Engine, RequestError
from nanoserve.runtime.engine.engine_status import EngineStatus
from nanoserve.runtime.engine.requests.pooling_params import PoolingParams
from nanoserve.runtime.engine.requests.request_times import RequestTimes
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.serving.request_stream import RequestStream
from nanoserve.runtime.engine.step.kv_events import KVEvent
from nanoserve.runtime.engine.step.scheduler import QueueFullError
from nanoserve.runtime.engine.step.sequence import Delta
from nanoserve.runtime.structured.grammar_spec import GrammarSpec
from nanoserve.runtime.text.tokenizer import Tokenizer

log = logging.getLogger("nanoserve.async_engine")
LAST_STEP_SECONDS = 10.0  # a stop waits this long for the step in flight to return
DEFAULT_MAX_BEHIND = 4096  # deltas (about tokens) per sample: ~40 s of a 100 tok/s stream


class EngineDeadError(NanoserveError, RuntimeError):
    """The step loop failed; the message carries the cause."""


class EngineClosedError(NanoserveError, RuntimeError):
    """The engine is shutting down and takes no new requests."""


class StreamBehindError(NanoserveError, RuntimeError):
    """A client read its stream so slowly that the deltas waiting for it passed the bound: the
    request was aborted (its blocks freed) rather than buffered without end."""


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Inbox: admit a validated request."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams | PoolingParams


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """Inbox: finish a request now and free its blocks."""

    request_id: str


Message = AddRequest | AbortRequest


class StepResult(NamedTuple):
    """What a step on the worker thread hands the event loop to deliver."""

    deltas: list[Delta]
    refused: list[tuple[str, Exception]]  # (request id, why): add_request failed on the thread


class AsyncEngine:
    def __init__(
        self,
        engine: Engine,
        *,
        step_timeout: float | None = None,
        max_behind: int = DEFAULT_MAX_BEHIND,
        frozen: bool = False,
    ) -> None:
        """step_timeout: the watchdog's limit on one step (None: none). A step that fails, or
        outlives it, kills the engine: in-flight requests get EngineDeadError, new ones
        EngineClosedError, and `on_fatal` is told (the server exits, for its supervisor).
        frozen: the boot froze its heap for this engine (boot_heap.py); shutdown thaws it."""
        self.engine = engine
        self.step_timeout = step_timeout
        self._frozen = frozen
        # Deltas a stream may hold unread, per sample: past it, the request is aborted.
        self.max_behind = max_behind
        self._behind: set[str] = set()  # requests aborted for it (their later deltas dropped)
        self._samples: dict[str, int] = {}  # n of each request in flight
        self.dead: str | None = None  # why the engine died; None while it lives
        self.on_fatal: Callable[[BaseException], None] | None = None
        self._inbox: deque[Message] = deque()
        self._streams: dict[str, asyncio.Queue[Delta | BaseException]] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._stopped = False  # the loop returns at its next turn
        self.observer: Callable[[RequestTimes], None] | None = None
        # Every step on one thread: each thread that enters OpenMP gets a team of its own, and
        # two teams spinning on two cores (asyncio.to_thread's pool alternates threads) made a
        # step 3x slower than the same step in-process.
        self._step_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nanoserve-step")

    # -- lifecycle --------------------------------------------------------------------------

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._loop(), name="nanoserve-engine")

    async def shutdown(self, grace_seconds: float = 5.0) -> None:
        """Stop taking requests, let in-flight ones finish within the grace, abort the rest."""
        try:
            await self._stop(grace_seconds)
        finally:
            if self._frozen:  # once, however the stop went
                self._frozen = False
                thaw_boot_heap()

    async def _stop(self, grace_seconds: float) -> None:
        self._closing = True
        deadline = time.monotonic() + grace_seconds
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for request_id in list(self._streams):
            self._inbox.append(AbortRequest(request_id))
        self._poke()
        deadline = time.monotonic() + 2.0
        while self._streams and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if self._task is not None:
            await self._end_loop(self._task)
        self._step_thread.shutdown(wait=False)
        self.engine.destroy()  # the loop is stopped: no step reads the recordings any more

    async def _end_loop(self, task: asyncio.Task[None]) -> None:
        """The loop returns at its next turn, after the step in flight (if any) has returned.
        A cancel alone is not enough: Python 3.11's wait_for swallows a cancel that arrives as
        the awaited step completes, and the loop would then wait for work forever."""
        self._stopped = True
        self._poke()
        await asyncio.wait({task}, timeout=LAST_STEP_SECONDS)
        if not task.done():  # the step thread is stuck: stop waiting for it
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
        if task.done() and not task.cancelled() and task.exception() is not None:
            log.error("the engine loop ended with %r", task.exception())

    def attach_kv_events(self, sink: Callable[[list[KVEvent]], object]) -> None:
        """Before start(): each step's KV-cache events go to sink, on the step thread."""
        self.engine.attach_kv_events(sink)

    async def reset_prefix_cache(self) -> int:
        """Forget every cached block, on the step thread between two steps."""
        if self._closing or self.dead is not None:
            raise EngineClosedError("the engine is shutting down")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._step_thread, self.engine.reset_prefix_cache)

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    @property
    def num_pending(self) -> int:
        """Requests accepted but not yet handed to the engine."""
        # tuple() copies in one C call: the step thread's popleft() cannot interleave, where
        # iterating the deque itself could raise "deque mutated during iteration".
        return sum(isinstance(m, AddRequest) for m in tuple(self._inbox))

    # -- the engine, as the server sees it --------------------------------------------------

    @property
    def name(self) -> str:
        return self.engine.name

    @property
    def max_model_len(self) -> int:
        return self.engine.config.max_model_len

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: object,
    ) -> str:
        return self.engine.render_chat(messages, add_generation_prompt, **extra)

    def default_max_tokens(self, prompt_len: int) -> int:
        return self.engine.default_max_tokens(prompt_len)

    def score_prompt(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        return self.engine.score_prompt(query, document, instruction)

    @property
    def template_reads_tools(self) -> bool:
        return self.engine.template_reads_tools

    @property
    def template_thinks(self) -> bool:
        return self.engine.template_thinks

    async def compile_grammar(self, spec: GrammarSpec) -> None:
        """Compile off the event loop (a large schema takes long), raising GrammarError; the
        check at `submit` is then a cache hit."""
        await asyncio.to_thread(self.engine.compile_grammar, spec)

    def status(self) -> EngineStatus:
        return self.engine.status()

    # -- requests ---------------------------------------------------------------------------

    def check_room(self, samples: int = 1) -> None:
        """QueueFullError unless `samples` more fit in the waiting queue (--max-waiting); the
        server asks before it reads a body, so a flood is refused at the cost of its headers."""
        if self.dead is not None or self._closing:
            return  # add_request says why with its 503
        limit = self.engine.config.max_waiting
        pending = self.engine.num_waiting + sum(
            m.params.n for m in tuple(self._inbox) if isinstance(m, AddRequest)
        )
        if limit is not None and pending + samples > limit:
            raise QueueFullError(f"{pending} requests are waiting (limit {limit}); try again later")

    def add_request(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | PoolingParams
    ) -> asyncio.Queue[Delta | BaseException]:
        """Validate now (raising the engine's named errors), run later; returns the stream."""
        if self.dead is not None:
            raise EngineClosedError(f"the engine has failed: {self.dead}")
        if self._closing:
            raise EngineClosedError("the server is shutting down")
        if self._task is None or self._task.done():
            raise EngineDeadError("the engine loop is not running")
        self.engine.check_request(prompt_ids, params)
        # Refused here, at the door, or never: the scheduler counts samples (n per request), and
        # a refusal from the step thread would come after a stream's 200 has been sent.
        limit = self.engine.config.max_waiting
        if limit is not None and params.n > limit:
            raise RequestError("n", f"n ({params.n}) exceeds the waiting queue's bound ({limit})")
        self.check_room(params.n)
        if request_id in self._streams:
            raise RequestError("request_id", f"request {request_id!r} is already in flight")
        stream: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
        self._streams[request_id] = stream
        self._samples[request_id] = params.n
        self._inbox.append(AddRequest(request_id, list(prompt_ids), params))
        self._poke()
        return stream

    def submit(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | PoolingParams
    ) -> RequestStream:
        """Validate and queue now (raising the engine's named errors); iterate for deltas."""
        times = RequestTimes(arrival=time.monotonic(), prompt_tokens=len(prompt_ids))
        queue = self.add_request(request_id, prompt_ids, params)
        return RequestStream(self, request_id, queue, params.n, times)

    def _closed(self, stream: RequestStream) -> None:
        if stream.remaining:
            self.abort(stream.request_id)
        self._streams.pop(stream.request_id, None)
        self._samples.pop(stream.request_id, None)
        self._behind.discard(stream.request_id)
        if self.observer is not None:
            self.observer(stream.times)

    def abort(self, request_id: str) -> None:
        self._inbox.append(AbortRequest(request_id))
        self._poke()

    # -- the loop ---------------------------------------------------------------------------

    def _poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _loop(self) -> None:
        assert self._wake is not None
        while not self._stopped:
            if not self._inbox and not self.engine.has_unfinished:
                self._wake.clear()
                await self._wake.wait()
                continue
            step = asyncio.get_running_loop().run_in_executor(self._step_thread, self._step)
            try:
                deltas, refused = await asyncio.wait_for(step, self.step_timeout)
            except TimeoutError:
                # The step thread is stuck (it cannot be stopped): the engine is lost.
                self._die(
                    EngineDeadError(
                        f"an engine step has not returned in {self.step_timeout:g} s"
                        " (--step-timeout)"
                    )
                )
                return
            except Exception as error:  # a bug, not a client's mistake: its state is suspect
                log.exception("engine step failed")
                self._die(EngineDeadError(f"engine step failed: {error!r}"))
                return
            for request_id, refusal in refused:
                stream = self._streams.get(request_id)
                if stream is not None:
                    stream.put_nowait(refusal)
            for delta in deltas:
                stream = self._streams.get(delta.request_id)
                if stream is None or delta.request_id in self._behind:
                    continue
                if stream.qsize() >= self.max_behind * self._samples.get(delta.request_id, 1):
                    self._fall_behind(delta.request_id, stream)
                    continue
                stream.put_nowait(delta)

    def _step(self) -> StepResult:
        """Worker thread: apply the inbox, then one engine step. Touches no stream: asyncio's
        queues belong to the event loop, which hands out what this returns."""
        deltas: list[Delta] = []
        refused: list[tuple[str, Exception]] = []
        while self._inbox:
            # Peek, apply, then pop: a request stays counted (inbox or scheduler) throughout,
            # so add_request on the event loop never sees room that is not there.
            message = self._inbox[0]
            if isinstance(message, AddRequest):
                try:
                    self.engine.add_request(message.request_id, message.prompt_ids, message.params)
                except Exception as error:
                    refused.append((message.request_id, error))
                finally:
                    self._inbox.popleft()
            else:
                self._inbox.popleft()
                deltas.extend(self.engine.abort(message.request_id))
        if self.engine.has_unfinished:
            deltas.extend(self.engine.step())
        return StepResult(deltas, refused)

    def _fall_behind(self, request_id: str, stream: asyncio.Queue[Delta | BaseException]) -> None:
        """A client that does not read must not make the server hold its tokens (and K/V) for
        ever: abort its request now, and tell it if it ever reads again."""
        log.warning(
            "request %s: its client fell %d deltas behind; aborted", request_id, stream.qsize()
        )
        self._behind.add(request_id)
        stream.put_nowait(
            StreamBehindError(
                f"the client fell more than {stream.qsize()} tokens behind its stream;"
                " the request was aborted"
            )
        )
        self.abort(request_id)

    def _die(self, error: EngineDeadError) -> None:
        log.error("the engine has failed: %s", error)
        self.dead = str(error)
        self._fail_all(error)
        if self.on_fatal is not None:
            self.on_fatal(error)

    def _fail_all(self, error: BaseException) -> None:
        for request_id, stream in list(self._streams.items()):
            stream.put_nowait(error)
            self._inbox.append(AbortRequest(request_id))
