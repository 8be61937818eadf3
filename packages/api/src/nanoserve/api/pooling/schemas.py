"""The pooling routes' request and response bodies, in the shapes their clients send and read:
OpenAI's embeddings, Jina's and Cohere's rerank (vLLM's `/rerank`, `/v1/rerank`, `/v2/rerank`),
and vLLM's score."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct


class EmbeddingRequest(Struct, kw_only=True):
    input: str | list[Any]  # a string, strings, token ids, or lists of them (routes.py checks)
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None  # a Matryoshka truncation, re-normalized
    user: str | None = None
    add_special_tokens: bool = True  # vLLM's: the tokenizer's own (an embedder's EOS, ...)
    normalize: bool | None = None  # vLLM's: None is the model's own


class Embedding(Struct, kw_only=True):
    index: int
    embedding: list[float] | str  # base64: the float32 values' little-endian bytes
    object: Literal["embedding"] = "embedding"


class PoolingUsage(Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(Struct, kw_only=True):
    data: list[Embedding]
    model: str
    usage: PoolingUsage
    object: Literal["list"] = "list"


class RerankDocument(Struct, kw_only=True):
    text: str


class RerankRequest(Struct, kw_only=True):
    query: str
    documents: list[str | RerankDocument]  # Cohere's v2 sends strings; objects with `text` too
    model: str | None = None
    top_n: int | None = None  # None or 0: every document
    return_documents: bool = True
    instruction: str | None = None  # the reranker's task line (Qwen3-Reranker's "Instruct")


class RerankResult(Struct, kw_only=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(Struct, kw_only=True):
    total_tokens: int


class RerankResponse(Struct, kw_only=True):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]


class ScoreRequest(Struct, kw_only=True):
    text_1: str | list[str]
    text_2: str | list[str]
    model: str | None = None
    instruction: str | None = None


class ScoreData(Struct, kw_only=True):
    index: int
    score: float
    object: Literal["score"] = "score"


class ScoreResponse(Struct, kw_only=True):
    id: str
    created: int
    model: str
    data: list[ScoreData]
    usage: PoolingUsage
    object: Literal["list"] = "list"
