"""EngineClient: everything the server asks of an engine, and nothing more.

`AsyncEngine` honours it; so does the tests' fake engine, which is why the routes, /health and
/metrics can be tested in milliseconds without a model. Handlers, translation and response
building are typed against it, never against `Engine`, its scheduler, blocks or runner: a
snapshot (`status()`) is the only window on the engine's internals.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, Protocol

from nanoserve.runtime import (
    AsyncEngine,
    Delta,
    Engine,
    EngineConfig,
    EngineStatus,
    GrammarSpec,
    KVEvent,
    PoolingParams,
    RequestTimes,
    SamplingParams,
    build_engine,
    freeze_boot_heap,
    thaw_boot_heap,
)


class TokenCodec(Protocol):
    """The tokenizer, as far as the server reads it: prompts in, token texts out."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str: ...

    def id_to_token(self, token_id: int) -> str | None: ...

    @property
    def vocab_size(self) -> int: ...


class DeltaStream(Protocol):
    """One submitted request's deltas until its n samples finish. Closing it early aborts the
    request (its blocks are freed at once)."""

    def __aiter__(self) -> AsyncIterator[Delta]: ...

    async def aclose(self) -> None: ...


class EngineClient(Protocol):
    observer: Callable[[RequestTimes], None] | None  # told each request's times at its end
    on_fatal: Callable[[BaseException], None] | None  # told once, if the engine dies

    @property
    def name(self) -> str: ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def tokenizer(self) -> TokenCodec: ...

    @property
    def num_pending(self) -> int:
        """Requests accepted but not yet handed to the engine (queued, for /metrics)."""
        ...

    def check_room(self, samples: int = 1) -> None:
        """QueueFullError unless `samples` more fit in the waiting queue."""
        ...

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: object,
    ) -> str:
        """The template's text; `extra` are template variables (tools, enable_thinking)."""
        ...

    def score_prompt(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        """A (query, document) pair's prompt ids as the reranker reads it."""
        ...

    def default_max_tokens(self, prompt_len: int) -> int:
        """What a request that leaves max_tokens unset may generate."""
        ...

    @property
    def template_reads_tools(self) -> bool:
        """Whether the chat template renders `tools` (else the server's tool prompt does)."""
        ...

    @property
    def template_thinks(self) -> bool:
        """Whether the chat template writes reasoning in <think> tags (reasoning.py splits it)."""
        ...

    async def compile_grammar(self, spec: GrammarSpec) -> None:
        """Compile a grammar ahead of `submit` (raising GrammarError for a bad one)."""
        ...

    def submit(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | PoolingParams
    ) -> DeltaStream:
        """Validate and queue now, raising the engine's named errors (a refusal surfaces before
        any byte of an answer is sent); iterate the stream for deltas."""
        ...

    def status(self) -> EngineStatus: ...

    def attach_kv_events(self, sink: Callable[[list[KVEvent]], object]) -> None:
        """Before start(): each step's KV-cache events go to sink (it must not block)."""
        ...

    async def reset_prefix_cache(self) -> int:
        """Forget every cached block; how many were named."""
        ...

    async def start(self) -> None: ...

    async def shutdown(self, grace_seconds: float) -> None: ...


class EngineFactory(Protocol):
    """Builds the engine in the boot thread: `say` reports progress (the latest line is /health's
    phase), `cancel` is set by a shutdown (stop at the next boundary: WarmupCancelled)."""

    def __call__(
        self, config: EngineConfig, say: Callable[[str], None], cancel: threading.Event
    ) -> EngineClient: ...


def build_async_engine(
    config: EngineConfig,
    say: Callable[[str], None],
    cancel: threading.Event,
    *,
    engine_type: Callable[..., Engine] = Engine,
) -> EngineClient:
    """The real engine: load, plan, warm (honouring cancel), freeze what the boot made (no full
    collection rescans it while serving), then wrap it for the event loop. engine_type: what
    build_engine builds (a test's engine that fails on cue)."""
    engine = build_engine(config, say=say, cancel=cancel, engine_type=engine_type)
    freeze_boot_heap()
    try:
        return AsyncEngine(engine, step_timeout=config.step_timeout, frozen=True)
    except BaseException:
        thaw_boot_heap()
        raise
