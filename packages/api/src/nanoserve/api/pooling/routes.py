"""POST /v1/embeddings (OpenAI), /rerank, /v1/rerank, /v2/rerank (Jina/Cohere) and /score,
/v1/score (vLLM): prefill-only requests, each prompt one engine request of `PoolingParams`.

Handlers only: turn the body into prompts (token ids), submit them together (a refusal of any
closes the rest: chat/merged_stream.py), and build the answer from each request's pooled vector
or score. A model that does not serve the task asked is refused by the engine with a 400 that
says what it serves (`--task`).
"""

from __future__ import annotations

import base64
import struct
import time
import uuid
from collections.abc import Sequence
from typing import Any

from litestar import Controller, Request, post
from litestar.di import NamedDependency
from litestar.params import JSONBody

from nanoserve.api.chat.engine_inputs import check_model
from nanoserve.api.chat.merged_stream import MergedStream
from nanoserve.api.pooling.schemas import (
    Embedding,
    EmbeddingRequest,
    EmbeddingResponse,
    PoolingUsage,
    RerankDocument,
    RerankRequest,
    RerankResponse,
    RerankResult,
    RerankUsage,
    ScoreData,
    ScoreRequest,
    ScoreResponse,
)
from nanoserve.api.server.admission import admit
from nanoserve.api.server.engine_client import EngineClient
from nanoserve.api.server.errors import APIError
from nanoserve.api.server.state import ServerState
from nanoserve.runtime import PoolingParams, score_pairs

MAX_INPUTS = 2048  # prompts per request, as OpenAI bounds an embeddings request
WINDOW = 32  # of a request's prompts, at most this many are in the engine at once


class PoolingController(Controller):
    before_request = staticmethod(admit)

    @post("/v1/embeddings", status_code=200)
    async def embeddings(
        self,
        request: Request,
        data: JSONBody[EmbeddingRequest],
        server: NamedDependency[ServerState],
    ) -> EmbeddingResponse:
        engine = server.require_engine()
        check_model(data, engine)
        prompts = embedding_prompts(data.input, engine, data.add_special_tokens)
        params = _params("embed", data.dimensions, data.normalize)
        vectors = await _pool(server, request, "embd", prompts, params)
        items = [
            Embedding(index=i, embedding=_encode(v, data.encoding_format))
            for i, v in enumerate(vectors)
        ]
        return EmbeddingResponse(data=items, model=engine.name, usage=_usage(prompts))

    @post(["/rerank", "/v1/rerank", "/v2/rerank"], status_code=200)
    async def rerank(
        self,
        request: Request,
        data: JSONBody[RerankRequest],
        server: NamedDependency[ServerState],
    ) -> RerankResponse:
        engine = server.require_engine()
        check_model(data, engine)
        texts = [d if isinstance(d, str) else d.text for d in data.documents]
        if not texts:
            raise APIError(400, "documents must hold at least one document", param="documents")
        if data.top_n is not None and data.top_n < 0:
            raise APIError(400, f"top_n must be >= 0, got {data.top_n}", param="top_n")
        prompts = [_pair(engine, data.query, t, data.instruction) for t in texts]
        scores = [s[0] for s in await _pool(server, request, "rerank", prompts, _params("score"))]
        order = sorted(range(len(texts)), key=lambda i: -scores[i])
        if data.top_n:
            order = order[: data.top_n]
        results = [
            RerankResult(
                index=i,
                relevance_score=scores[i],
                document=RerankDocument(text=texts[i]) if data.return_documents else None,
            )
            for i in order
        ]
        usage = RerankUsage(total_tokens=sum(len(p) for p in prompts))
        return RerankResponse(
            id=f"rerank-{uuid.uuid4().hex}", model=engine.name, usage=usage, results=results
        )

    @post(["/score", "/v1/score"], status_code=200)
    async def score(
        self,
        request: Request,
        data: JSONBody[ScoreRequest],
        server: NamedDependency[ServerState],
    ) -> ScoreResponse:
        engine = server.require_engine()
        check_model(data, engine)
        first = [data.text_1] if isinstance(data.text_1, str) else data.text_1
        second = [data.text_2] if isinstance(data.text_2, str) else data.text_2
        pairs = score_pairs(first, second)
        if pairs is None:
            raise APIError(
                400,
                f"text_1 ({len(first)} texts) and text_2 ({len(second)}) cannot be paired: send"
                " one text_1, or lists of the same non-zero length",
                param="text_2",
            )
        prompts = [_pair(engine, q, d, data.instruction) for q, d in pairs]
        scores = await _pool(server, request, "score", prompts, _params("score"))
        return ScoreResponse(
            id=f"score-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=engine.name,
            data=[ScoreData(index=i, score=s[0]) for i, s in enumerate(scores)],
            usage=_usage(prompts),
        )


def embedding_prompts(value: Any, engine: EngineClient, special: bool) -> list[list[int]]:
    """OpenAI's `input`: a string, strings, token ids, or lists of token ids."""
    encode = engine.tokenizer.encode
    if isinstance(value, str):
        return [encode(value, add_special_tokens=special)]
    if not value:
        raise APIError(400, "input must not be empty", param="input")
    if len(value) > MAX_INPUTS:
        raise APIError(400, f"input holds {len(value)} items, at most {MAX_INPUTS}", param="input")
    if all(isinstance(v, str) for v in value):
        return [encode(v, add_special_tokens=special) for v in value]
    if all(_is_token(v) for v in value):
        return [list(value)]
    if all(isinstance(v, list) and all(_is_token(t) for t in v) for v in value):
        return [list(v) for v in value]
    raise APIError(
        400,
        "input must be a string, a list of strings, or token ids (a list, or lists)",
        param="input",
    )


def _is_token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _pair(engine: EngineClient, query: str, document: str, instruction: str | None) -> list[int]:
    return engine.score_prompt(query, document, instruction)


def _params(
    task: str, dimensions: int | None = None, normalize: bool | None = None
) -> PoolingParams:
    try:
        return PoolingParams(task, dimensions=dimensions, normalize=normalize)  # type: ignore[arg-type]
    except ValueError as error:
        raise APIError(400, str(error), param=getattr(error, "field", None)) from None


async def _pool(
    server: ServerState,
    request: Request,
    prefix: str,
    prompts: Sequence[Sequence[int]],
    params: PoolingParams,
) -> list[tuple[float, ...]]:
    """Every prompt's answer, in order. At most WINDOW prompts are in the engine at once (a
    2,048-input request neither fills the waiting queue nor crowds out the chat traffic queued
    behind it); each window is submitted together and drained (a client that leaves aborts
    it)."""
    engine = server.require_engine()
    request_id = f"{prefix}-{uuid.uuid4().hex}"
    answers: list[tuple[float, ...]] = []
    for start in range(0, len(prompts), WINDOW):
        window = prompts[start : start + WINDOW]
        requests = [(f"{request_id}-{start + i}", p) for i, p in enumerate(window)]
        merged = await MergedStream.submit(
            engine, requests, params, timeout=server.settings.request_timeout
        )
        pooled: dict[int, tuple[float, ...]] = {}
        for index, delta in await merged.drain(request):
            if delta.pooled is not None:
                pooled[index] = delta.pooled
            elif delta.finish_reason == "abort":
                raise APIError(503, "the request was aborted before its answer", code="aborted")
        answers.extend(pooled[i] for i in range(len(window)))
    return answers


def _encode(vector: tuple[float, ...], encoding_format: str) -> list[float] | str:
    if encoding_format == "base64":
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
    return list(vector)


def _usage(prompts: Sequence[Sequence[int]]) -> PoolingUsage:
    tokens = sum(len(p) for p in prompts)
    return PoolingUsage(prompt_tokens=tokens, total_tokens=tokens)


__all__ = ["PoolingController"]
