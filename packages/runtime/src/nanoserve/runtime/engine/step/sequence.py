"""Sequence: one sample of one request — its tokens, its blocks, and what it has emitted."""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from collections.abc import Sequence as Seq
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from nanoserve.core import BlockTable
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.engine.step.pooling_state import PoolingState
from nanoserve.runtime.text.tokenizer import IncrementalDetokenizer, Tokenizer

if TYPE_CHECKING:
    from llguidance import LLMatcher

log = logging.getLogger("nanoserve.engine")


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True, slots=True)
class Delta:
    """What one step added to one sequence: the unit a stream carries."""

    request_id: str
    index: int  # which of the request's n samples
    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...] | None
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] | None
    finish_reason: str | None  # "stop" | "length" | "abort" | None while running
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    # What ended a "stop": the stop string matched, or the stop token (not an EOS); vLLM's name
    stop_reason: str | int | None = None
    # A pooling request's answer (an embedding, or one score), in its last delta only
    pooled: tuple[float, ...] | None = None


@dataclass(slots=True)
class Sequence:
    seq_id: int
    request_id: str
    index: int
    prompt_ids: list[int]
    params: SamplingParams
    block_table: BlockTable
    detokenizer: IncrementalDetokenizer
    eos_token_ids: frozenset[int]
    generator: torch.Generator | None = None
    after: int | None = None  # a sibling whose prompt must be cached before this one starts
    # The grammar's state after output_ids (None: unconstrained). Preemption keeps output_ids,
    # so the state stays in step with them: a recomputed sequence resumes where it was.
    grammar: LLMatcher | None = None
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0
    num_cached: int = 0
    state_slot: int | None = None  # its recurrent-state slot while running (StateSlots)
    block_hashes: list[int] = field(default_factory=list)  # prefix-cache keys of full blocks
    status: Status = Status.WAITING
    finish_reason: str | None = None
    stop_reason: str | int | None = None  # the stop string or stop token that finished it
    text: str = ""  # decoded output so far, stop strings not yet cut
    emitted: int = 0  # how much of text has been handed out
    arrival: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None
    # Appended by commit, drained by the delta of this step.
    pending_ids: list[int] = field(default_factory=list)
    pending_logprobs: list[float] = field(default_factory=list)
    pending_top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    pooling: PoolingState | None = None  # a pooling request's (it samples nothing)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def token_ids(self) -> list[int]:
        """Prompt and output, copied: for admission and block hashing, not every step."""
        return self.prompt_ids + self.output_ids

    def tokens(self, start: int, end: int) -> tuple[int, ...]:
        """Positions [start, end) of prompt then output, copying only those."""
        prompt = len(self.prompt_ids)
        head = self.prompt_ids[start:end] if start < prompt else []
        tail = self.output_ids[max(start - prompt, 0) : end - prompt] if end > prompt else []
        return (*head, *tail)

    def append(self, token_id: int, logprob: float | None, top: tuple | None) -> None:
        """Take a sampled token; finish on eos, a stop token, a stop string, max_tokens, or a
        grammar that can take nothing more (abort on a grammar that failed)."""
        grammar_done = False
        if self.grammar is not None:
            if not self._advance_grammar(token_id):
                return
            grammar_done = self.grammar.is_stopped()
        self.output_ids.append(token_id)
        self.pending_ids.append(token_id)
        if logprob is not None:
            self.pending_logprobs.append(logprob)
            self.pending_top.append(top or ())
        if self.first_token_at is None:
            self.first_token_at = time.monotonic()
        stop_token = token_id in self.params.stop_token_ids or (
            token_id in self.eos_token_ids and not self.params.ignore_eos
        )
        if not stop_token:
            self.text += self.detokenizer.push(token_id)
            if self._cut_stop_string():
                return
        if stop_token or grammar_done:
            self.text += self.detokenizer.flush()
            if token_id in self.params.stop_token_ids:
                self.stop_reason = token_id
            self.finish("stop")
        elif len(self.output_ids) >= self.params.max_tokens:
            self.text += self.detokenizer.flush()
            if not self._cut_stop_string():
                self.finish("length")

    def _advance_grammar(self, token_id: int) -> bool:
        """Feed the grammar the token; False (and the sequence aborted, the token dropped) when
        llguidance has failed. The mask allowed only tokens the grammar takes, so that is its
        own failure (a resource limit), after which its masks allow only end-of-sequence: the
        answer would end looking whole. "abort" says it did not."""
        assert self.grammar is not None
        if self.grammar.consume_token(token_id) and not self.grammar.is_error():
            return True
        log.warning("grammar failed at token %d: %s", token_id, self.grammar.get_error())
        self.text += self.detokenizer.flush()
        self.finish("abort")
        return False

    def _cut_stop_string(self) -> bool:
        stops = self.params.stop
        if not stops:
            return False
        longest = max(len(s) for s in stops)
        window_start = max(0, self.emitted - longest)
        hits = [(self.text.find(s, window_start), s) for s in stops]
        hits = [(at, s) for at, s in hits if at >= 0]
        if not hits:
            return False
        at, self.stop_reason = min(hits)
        self.text = self.text[:at]
        self.finish("stop")
        return True

    def reset_for_recompute(self) -> None:
        """Preempted: its blocks were freed, so everything computed is recomputed from the
        start (prompt and output alike) once it is admitted again."""
        self.num_computed = 0
        self.num_cached = 0
        self.block_hashes.clear()
        self.status = Status.WAITING

    def finish(self, reason: str) -> None:
        self.status = Status.FINISHED
        self.finish_reason = reason

    def take_delta(self) -> Delta:
        """The text and tokens not yet handed out, holding back a possible stop-string prefix."""
        end = len(self.text)
        if not self.finished and self.params.stop:
            end -= _held_back(self.text, self.params.stop)
        end = max(end, self.emitted)
        text = self.text[self.emitted : end]
        self.emitted = end
        delta = Delta(
            request_id=self.request_id,
            index=self.index,
            text=text,
            token_ids=tuple(self.pending_ids),
            logprobs=tuple(self.pending_logprobs) if self.params.logprobs is not None else None,
            top_logprobs=tuple(self.pending_top) if self.params.logprobs is not None else None,
            finish_reason=self.finish_reason,
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=len(self.output_ids),
            cached_tokens=self.num_cached,
            stop_reason=self.stop_reason if self.finished else None,
            pooled=self.pooling.result if self.pooling is not None and self.finished else None,
        )
        self.pending_ids.clear()
        self.pending_logprobs.clear()
        self.pending_top.clear()
        return delta


def request_sequences(
    request_id: str,
    prompt_ids: Seq[int],
    params: SamplingParams,
    seq_ids: Iterator[int],
    *,
    block_size: int,
    tokenizer: Tokenizer,
    eos_token_ids: frozenset[int],
    device: torch.device,
    grammar: Callable[[], LLMatcher] | None = None,
) -> list[Sequence]:
    """A request's `params.n` samples, each with its own id, detokenizer, grammar matcher and,
    for a seeded request, its own generator (seed + its index)."""
    seqs = []
    for index in range(params.n):
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=device).manual_seed(params.seed + index)
        seqs.append(
            Sequence(
                seq_id=next(seq_ids),
                request_id=request_id,
                index=index,
                prompt_ids=list(prompt_ids),
                params=params,
                block_table=BlockTable(block_size),
                detokenizer=IncrementalDetokenizer(
                    tokenizer, skip_special_tokens=params.skip_special_tokens
                ),
                eos_token_ids=eos_token_ids,
                generator=generator,
                grammar=grammar() if grammar is not None else None,
            )
        )
    return seqs


def pooling_sequence(
    request_id: str,
    prompt_ids: Seq[int],
    state: PoolingState,
    seq_id: int,
    *,
    block_size: int,
    tokenizer: Tokenizer,
) -> Sequence:
    """A pooling request's one sequence: its prompt, computed and pooled, then finished."""
    return Sequence(
        seq_id=seq_id,
        request_id=request_id,
        index=0,
        prompt_ids=list(prompt_ids),
        params=POOLING_SAMPLING,
        block_table=BlockTable(block_size),
        detokenizer=IncrementalDetokenizer(tokenizer, skip_special_tokens=True),
        eos_token_ids=frozenset(),
        pooling=state,
    )


POOLING_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)  # never sampled from


def _held_back(text: str, stops: Iterable[str]) -> int:
    """Length of the longest suffix of text that is a proper prefix of some stop string."""
    best = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), best, -1):
            if text.endswith(stop[:size]):
                best = size
                break
    return best
