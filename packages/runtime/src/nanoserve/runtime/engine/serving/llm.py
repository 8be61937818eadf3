"""LLM: the offline API, the way vLLM users expect it — generate() and chat() over a batch."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import cast

from nanoserve.runtime.engine.boot.build import build_engine
from nanoserve.runtime.engine.config.engine_config import EngineConfig
from nanoserve.runtime.engine.engine import Engine, RequestError
from nanoserve.runtime.engine.requests.pooling_params import PoolingParams
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams
from nanoserve.runtime.text.rerank_prompt import score_pairs
from nanoserve.runtime.text.tokenizer import Tokenizer

Prompt = str | Sequence[int]
Message = Mapping[str, str]


@dataclass(slots=True)
class CompletionOutput:
    index: int
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    logprobs: list[float] | None = None
    top_logprobs: list[tuple[tuple[int, float], ...]] | None = None


@dataclass(slots=True)
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    cached_tokens: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_generated_tokens(self) -> int:
        return sum(len(o.token_ids) for o in self.outputs)


@dataclass(frozen=True, slots=True)
class PoolingOutput:
    """One pooling request's answer (vLLM's EmbeddingRequestOutput / ScoringRequestOutput):
    `embedding` for LLM.embed, `score` for LLM.score."""

    request_id: str
    prompt_token_ids: list[int]
    embedding: list[float] | None = None
    score: float | None = None


class LLM:
    """`LLM(model=None)` serves the embedded model; keyword arguments are EngineConfig fields."""

    def __init__(self, model: str | None = None, *, engine: Engine | None = None, **config: object):
        self.engine = engine or build_engine(EngineConfig(model=model, **config))  # type: ignore[arg-type]
        self._ids = itertools.count()

    @property
    def tokenizer(self) -> Tokenizer:
        return self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        one = isinstance(prompts, str) or bool(prompts and isinstance(prompts[0], int))
        batch = [cast(Prompt, prompts)] if one else list(cast(Sequence[Prompt], prompts))
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(batch)
        if len(params) != len(batch):
            raise RequestError("params", f"{len(batch)} prompts but {len(params)} SamplingParams")
        encoded: list[tuple[str | None, list[int]]] = [
            (p, self.engine.tokenizer.encode(p, add_special_tokens=True))
            if isinstance(p, str)
            else (None, list(p))
            for p in batch
        ]
        return self._run(encoded, list(params))

    def chat(
        self,
        conversations: Sequence[Message] | Sequence[Sequence[Message]],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        one = bool(conversations) and isinstance(conversations[0], Mapping)
        batch = (
            [cast(Sequence[Message], conversations)]
            if one
            else list(cast(Sequence[Sequence[Message]], conversations))
        )
        texts = [self.engine.render_chat(list(c)) for c in batch]
        encoded: list[tuple[str | None, list[int]]] = [
            (t, self.engine.tokenizer.encode(t, add_special_tokens=False)) for t in texts
        ]
        if params is None or isinstance(params, SamplingParams):
            params = [params or SamplingParams()] * len(texts)
        return self._run(encoded, list(params))

    def embed(
        self,
        prompts: Prompt | Sequence[Prompt],
        *,
        dimensions: int | None = None,
        normalize: bool | None = None,
    ) -> list[PoolingOutput]:
        """Embeddings of prompts (texts, with the tokenizer's special tokens; or token ids), by
        the model's pooling (`--task embed`, or what its files say)."""
        one = isinstance(prompts, str) or bool(prompts and isinstance(prompts[0], int))
        batch = [cast(Prompt, prompts)] if one else list(cast(Sequence[Prompt], prompts))
        ids = [
            self.engine.tokenizer.encode(p, add_special_tokens=True)
            if isinstance(p, str)
            else list(p)
            for p in batch
        ]
        params = PoolingParams("embed", dimensions=dimensions, normalize=normalize)
        return self._pool(ids, params)

    def score(
        self, text_1: str | Sequence[str], text_2: str | Sequence[str]
    ) -> list[PoolingOutput]:
        """Relevance scores of (query, document) pairs, as vLLM's `LLM.score`: one text_1 against
        each text_2, or the two lists pairwise; each scored on the reranker's prompt."""
        first = [text_1] if isinstance(text_1, str) else list(text_1)
        second = [text_2] if isinstance(text_2, str) else list(text_2)
        pairs = score_pairs(first, second)
        if pairs is None:
            raise RequestError(
                "text_2", f"{len(first)} first texts cannot be paired with {len(second)} second"
            )
        ids = [self.engine.score_prompt(q, d) for q, d in pairs]
        return self._pool(ids, PoolingParams("score"))

    def _pool(self, ids: list[list[int]], params: PoolingParams) -> list[PoolingOutput]:
        for prompt in ids:  # all or nothing, as generate
            self.engine.check_request(prompt, params)
        order = []
        for prompt in ids:
            request_id = f"offline-{next(self._ids)}"
            self.engine.add_request(request_id, prompt, params)
            order.append(request_id)
        answers: dict[str, tuple[float, ...]] = {}
        while self.engine.has_unfinished:
            for delta in self.engine.step():
                if delta.pooled is not None:
                    answers[delta.request_id] = delta.pooled
        return [
            PoolingOutput(
                request_id,
                prompt,
                embedding=list(answers[request_id]) if params.task == "embed" else None,
                score=answers[request_id][0] if params.task == "score" else None,
            )
            for request_id, prompt in zip(order, ids, strict=True)
        ]

    def _run(
        self, encoded: list[tuple[str | None, list[int]]], params: list[SamplingParams]
    ) -> list[RequestOutput]:
        results: dict[str, RequestOutput] = {}
        order = []
        for (_, ids), p in zip(encoded, params, strict=True):  # all or nothing: a bad prompt
            self.engine.check_request(ids, p)  # must not leave the good ones queued behind it
        for (text, ids), p in zip(encoded, params, strict=True):
            request_id = f"offline-{next(self._ids)}"
            self.engine.add_request(request_id, ids, p)
            outputs = [CompletionOutput(index=i) for i in range(p.n)]
            results[request_id] = RequestOutput(request_id, text, ids, outputs)
            order.append(request_id)
        while self.engine.has_unfinished:
            for delta in self.engine.step():
                result = results[delta.request_id]
                out = result.outputs[delta.index]
                out.text += delta.text
                out.token_ids.extend(delta.token_ids)
                if delta.logprobs is not None:
                    out.logprobs = (out.logprobs or []) + list(delta.logprobs)
                    out.top_logprobs = (out.top_logprobs or []) + list(delta.top_logprobs or ())
                out.finish_reason = delta.finish_reason
                result.cached_tokens = max(result.cached_tokens, delta.cached_tokens)
        return [results[r] for r in order]
