"""FakeEngine: an `EngineClient` with no model, for in-process API tests that run in milliseconds.

It answers every sample of a request with a scripted reply, one character-token per delta
(samples interleaved, as a batch would), the last delta carrying the finish reason: "stop" when
the reply fits max_tokens, "length" when it is cut. Logprobs, when asked for, are exact binary
fractions, so tests can assert them with ==. A test can script the deltas outright (`script`),
make a submit refuse (`refusals`), and read what was submitted and what was closed.

`FakeTokenizer` is one token per character (its code point), so prompt lengths and token texts
are plain to read in a test.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from nanoserve.api.server.engine_client import EngineClient
from nanoserve.core import KVPoolPlan
from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.runtime.decode.recordings import RecordingStats
from nanoserve.runtime.decode.warmup import WarmupReport
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine_status import EngineStatus, PrefixCacheCounts
from nanoserve.runtime.engine.requests.pooling_params import PoolingParams
from nanoserve.runtime.engine.requests.request_times import RequestTimes
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step.scheduler import QueueFullError
from nanoserve.runtime.engine.step.sequence import Delta
from nanoserve.runtime.structured.grammar_spec import GrammarSpec
from nanoserve.runtime.text.rerank_prompt import rerank_prompt

MODEL = "fake-model"
POOL = KVPoolPlan(
    num_layers=2, num_kv_heads=2, head_dim=16, dtype=torch.float32, block_size=16, num_blocks=8
)  # 128 slots
TOKEN_SECONDS = 0.25  # the fake clock's time per token, an exact binary fraction
Script = Callable[[str, list[int], SamplingParams], Sequence[Delta | BaseException]]


class FakeTokenizer:
    """One token per character: its code point. No BOS, no special tokens."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)

    def id_to_token(self, token_id: int) -> str | None:
        return f"<{token_id}>"

    vocab_size = 0x110000  # every code point


def logprob(position: int) -> float:
    """The fake's logprob of a sample's token at position 0, 1, ...: -1/8, -2/8, ..."""
    return -(position + 1) / 8


def top_logprobs(token_id: int, position: int, k: int) -> tuple[tuple[int, float], ...]:
    """k alternatives: the chosen token first, then the next code points, each 1 nat less."""
    return tuple((token_id + j, logprob(position) - j) for j in range(k))


@dataclass(frozen=True, slots=True)
class Submitted:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


class FakeStream:
    """One request's scripted deltas; an exception in the script is raised in its place. Its
    times (on a fake clock: the k-th token at k * TOKEN_SECONDS after arrival) go to the
    engine's observer when it closes, as AsyncEngine's do."""

    def __init__(
        self,
        owner: FakeEngine,
        request_id: str,
        prompt_ids: list[int],
        items: Sequence[Delta | BaseException],
    ) -> None:
        self._owner = owner
        self._request_id = request_id
        self._items = list(items)
        self._closed = False
        self.times = RequestTimes(arrival=0.0, prompt_tokens=len(prompt_ids))

    def __aiter__(self) -> AsyncIterator[Delta]:
        return self

    async def __anext__(self) -> Delta:
        # A step boundary: other requests' tasks run between deltas (a slow engine's steps).
        await asyncio.sleep(self._owner.step_seconds)
        if not self._items:
            await self.aclose()
            raise StopAsyncIteration
        item = self._items.pop(0)
        if isinstance(item, BaseException):
            await self.aclose()
            raise item
        times = self.times
        if item.token_ids:
            now = TOKEN_SECONDS * (len(times.token_times) + 1)
            times.first_token = now if times.first_token is None else times.first_token
            times.token_times.append(now)
            times.sample_times.setdefault(item.index, []).append(now)
            times.completion_tokens += len(item.token_ids)
        if item.finish_reason is not None:
            times.finish_reasons.append(item.finish_reason)
        return item

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._owner.closed.append(self._request_id)
            if self._owner.observer is not None:
                self._owner.observer(self.times)


@dataclass(eq=False)
class FakeEngine:
    name: str = MODEL
    max_model_len: int = 64
    replies: tuple[str, ...] = ("Hello!",)  # sample i answers replies[i % len(replies)]
    cached_tokens: int = 0  # every delta's prefix-cache hit count
    script: Script | None = None  # replaces the replies: (request id, prompt ids, params)
    refusals: list[BaseException | None] = field(default_factory=list)  # next submits', in turn
    warm: WarmupReport | None = None
    recordings: RecordingStats | None = None
    status_fields: dict[str, Any] = field(default_factory=dict)  # overrides in status()
    num_pending: int = 0
    room: int | None = None  # samples the waiting queue still takes; None: no bound
    tokenizer: FakeTokenizer = field(default_factory=FakeTokenizer)
    observer: Callable[[RequestTimes], None] | None = None
    on_fatal: Callable[[BaseException], None] | None = None
    submitted: list[Submitted] = field(default_factory=list)
    # pooling requests: (request id, prompt ids, params); answered by pooled_reply
    pooling_submitted: list[tuple[str, list[int], PoolingParams]] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)  # request ids, as their streams closed
    chats: list[list[dict]] = field(default_factory=list)  # messages render_chat was given
    template_vars: list[dict] = field(default_factory=list)  # and its template variables
    started: bool = False
    shutdown_grace: float | None = None  # set by shutdown
    generation_prompt: str = "<assistant>"  # what a rendered chat ends with (harmony's: gpt-oss)

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        add_generation_prompt: bool = True,
        **extra: object,
    ) -> str:
        self.chats.append([dict(m) for m in messages])
        self.template_vars.append(dict(extra))
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages)
        return text + self.generation_prompt if add_generation_prompt else text

    def score_prompt(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        text = rerank_prompt(query, document, instruction)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def check_room(self, samples: int = 1) -> None:
        if self.room is not None and samples > self.room:
            raise QueueFullError(f"the fake's queue takes {self.room} more")

    def default_max_tokens(self, prompt_len: int) -> int:
        return max(1, min(self.max_model_len, POOL.num_slots) - prompt_len)

    step_seconds: float = 0.0  # between deltas: a slow engine
    template_reads_tools: bool = False
    template_thinks: bool = False
    grammars: list[GrammarSpec] = field(default_factory=list)  # compile_grammar's, in turn
    grammar_refusal: BaseException | None = None  # what compile_grammar raises

    async def compile_grammar(self, spec: GrammarSpec) -> None:
        self.grammars.append(spec)
        if self.grammar_refusal is not None:
            raise self.grammar_refusal

    def submit(
        self, request_id: str, prompt_ids: Sequence[int], params: SamplingParams | PoolingParams
    ) -> FakeStream:
        if self.refusals:
            refusal = self.refusals.pop(0)
            if refusal is not None:
                raise refusal
        ids = list(prompt_ids)
        if isinstance(params, PoolingParams):
            self.pooling_submitted.append((request_id, ids, params))
            return FakeStream(self, request_id, ids, [pooled_reply(request_id, ids, params)])
        self.submitted.append(Submitted(request_id, list(prompt_ids), params))
        script = self.script or self.scripted_replies
        return FakeStream(self, request_id, ids, script(request_id, ids, params))

    def scripted_replies(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams
    ) -> list[Delta]:
        """Each sample's reply, cut to max_tokens, one token per delta, samples interleaved."""
        samples = []
        for index in range(params.n):
            reply = self.tokenizer.encode(self.replies[index % len(self.replies)])
            finish = "length" if len(reply) > params.max_tokens else "stop"
            samples.append((reply[: params.max_tokens], finish))
        deltas = []
        for position in range(max(len(ids) for ids, _ in samples)):
            for index, (ids, finish) in enumerate(samples):
                if position >= len(ids):
                    continue
                token = ids[position]
                last = position == len(ids) - 1
                deltas.append(
                    Delta(
                        request_id=request_id,
                        index=index,
                        text=chr(token),
                        token_ids=(token,),
                        logprobs=None if params.logprobs is None else (logprob(position),),
                        top_logprobs=None
                        if params.logprobs is None
                        else (top_logprobs(token, position, params.logprobs),),
                        finish_reason=finish if last else None,
                        prompt_tokens=len(prompt_ids),
                        completion_tokens=position + 1,
                        cached_tokens=self.cached_tokens,
                    )
                )
        return deltas

    def status(self) -> EngineStatus:
        base = EngineStatus(
            model=self.name,
            dtype="float32",
            quantize=None,
            device="cpu",
            cpu="AVX2 (avx2 fma f16c)",
            threads=2,
            kernels="float32 torch/mkl",
            weights=None,
            weight_fallbacks=None,
            decode_mode="eager" if self.recordings is None else "recorded",
            prefill_budget=None,
            max_model_len=self.max_model_len,
            ready_seconds=0.25,
            pool=POOL,
            state=StatePoolPlan(4, ()),
            state_slots_in_use=0,
            blocks_in_use=0,
            kv_cache_usage=0.0,
            warm=self.warm,
            recordings=self.recordings,
            running=0,
            waiting=0,
            waiting_requests=0,
            prefix_cache=PrefixCacheCounts(queried_tokens=0, hit_tokens=0),
            prompt_tokens=sum(len(s.prompt_ids) for s in self.submitted),
            generation_tokens=0,
            finished={},
            steps=0,
        )
        return dataclasses.replace(base, **self.status_fields)

    def attach_kv_events(self, sink: Callable[[list[Any]], object]) -> None:
        self.kv_sink = sink

    async def reset_prefix_cache(self) -> int:
        self.resets += 1
        return 0

    kv_sink: Callable[[list[Any]], object] | None = None
    resets: int = 0

    async def start(self) -> None:
        self.started = True

    async def shutdown(self, grace_seconds: float) -> None:
        self.shutdown_grace = grace_seconds

    def factory(
        self, config: EngineConfig, say: Callable[[str], None], cancel: threading.Event
    ) -> EngineClient:
        """An `EngineFactory` that hands out this engine (the boot thread calls it)."""
        say(f"loading {self.name}")
        return self


def pooled_reply(request_id: str, prompt_ids: list[int], params: PoolingParams) -> Delta:
    """A pooling request's one delta: an embedding of (length, first id, last id, 0.5), cut to
    `dimensions`; a score of 1 / (1 + length), so a shorter prompt scores higher."""
    if params.task == "score":
        pooled: tuple[float, ...] = (1.0 / (1 + len(prompt_ids)),)
    else:
        full = (float(len(prompt_ids)), float(prompt_ids[0]), float(prompt_ids[-1]), 0.5)
        pooled = full[: params.dimensions] if params.dimensions else full
    return Delta(
        request_id=request_id,
        index=0,
        text="",
        token_ids=(),
        logprobs=None,
        top_logprobs=None,
        finish_reason="stop",
        prompt_tokens=len(prompt_ids),
        completion_tokens=0,
        pooled=pooled,
    )
