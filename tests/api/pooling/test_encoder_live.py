"""`nanoserve serve` on BERT-family folders: a BERT embedder through the OpenAI client, and a
cross-encoder through `/rerank` and `/score` in plain JSON, each answer the offline LLM's."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from nanoserve.runtime import LLM
from tests import tiny_encoders, tiny_gemma_embedder

ARGS = ("--max-batch", "4", "--max-num-batched-tokens", "64", "--grace-seconds", "2")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("encoders")
    return {
        "embed": tiny_encoders.make_tiny_encoder_dir(tmp, "bert"),
        "rerank": tiny_encoders.make_tiny_cross_encoder_dir(tmp, "xlm-roberta"),
    }


@pytest.fixture(scope="module")
def embedder(start_server: Callable[..., Any], folders: dict[str, Path]) -> Iterator[Any]:
    live = start_server(str(folders["embed"]), *ARGS)
    yield live
    assert live.stop() == 0, live.log()


@pytest.fixture(scope="module")
def reranker(start_server: Callable[..., Any], folders: dict[str, Path]) -> Iterator[Any]:
    live = start_server(str(folders["rerank"]), *ARGS)
    yield live
    assert live.stop() == 0, live.log()


def test_embeddings_through_the_openai_client(embedder: Any, folders: dict[str, Path]) -> None:
    import openai

    name = httpx.get(f"{embedder.url}/health", timeout=10).json()["model"]
    with openai.OpenAI(base_url=f"{embedder.url}/v1", api_key="unused", max_retries=0) as client:
        answer = client.embeddings.create(model=name, input=["hello world", "the cat sat"])
    # the server's dtype (auto: bf16 where the CPU has it natively, as a Zen 4 does)
    offline = LLM(str(folders["embed"]), dtype="auto").embed(["hello world", "the cat sat"])
    assert [d.embedding for d in answer.data] == [o.embedding for o in offline]
    assert "serving embed: mean pooling, normalized (modules.json)" in embedder.log()
    assert "no K/V kept (whole inputs, both ways)" in embedder.log()


def test_rerank_and_score_in_plain_json(reranker: Any, folders: dict[str, Path]) -> None:
    documents = ["hello world", "a dog sat on the mat", "the query"]
    body = {"query": "hello", "documents": documents, "top_n": 2, "return_documents": True}
    ranked = httpx.post(f"{reranker.url}/v1/rerank", json=body, timeout=30).json()
    offline = [
        s
        for o in LLM(str(folders["rerank"]), dtype="auto").score("hello", documents)
        if (s := o.score) is not None
    ]
    best = sorted(range(3), key=lambda i: -offline[i])[:2]
    assert [r["index"] for r in ranked["results"]] == best
    assert [r["relevance_score"] for r in ranked["results"]] == [offline[i] for i in best]
    assert ranked["results"][0]["document"]["text"] == documents[best[0]]
    score = {"text_1": "hello", "text_2": documents}
    scored = httpx.post(f"{reranker.url}/score", json=score, timeout=30).json()
    assert [d["score"] for d in scored["data"]] == offline


def test_generation_on_an_encoder_is_a_400(
    reranker: Any, assert_openai_error: Callable[..., Any]
) -> None:
    body = {"prompt": "hello", "max_tokens": 2}
    response = httpx.post(f"{reranker.url}/v1/completions", json=body, timeout=30)
    assert "serves rerank, it does not generate" in assert_openai_error(response, 400)["message"]


def test_an_embeddinggemma_gguf_through_the_openai_client(
    start_server: Callable[..., Any],
    tmp_path_factory: pytest.TempPathFactory,
    assert_openai_error: Callable[..., Any],
) -> None:
    tmp = tmp_path_factory.mktemp("embeddinggemma")
    folder = tiny_gemma_embedder.make_tiny_embedding_gemma_dir(tmp)
    path = tiny_gemma_embedder.write_tiny_embedding_gemma_gguf(folder, tmp / "eg.gguf")
    live = start_server(str(path), *ARGS)
    try:
        import openai

        texts = ["hello world", "the quick brown fox jumps over the lazy dog"]
        name = httpx.get(f"{live.url}/health", timeout=10).json()["model"]
        with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as client:
            answer = client.embeddings.create(model=name, input=texts)
        offline = LLM(str(path), dtype="auto").embed(texts)  # the server's dtype
        assert [d.embedding for d in answer.data] == [o.embedding for o in offline]
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        response = httpx.post(f"{live.url}/v1/chat/completions", json=chat, timeout=30)
        assert "serves embed, it does not generate" in assert_openai_error(response, 400)["message"]
        assert "2 dense, normalized (GGUF gemma-embedding.pooling_type 1)" in live.log()
    finally:
        assert live.stop() == 0, live.log()
