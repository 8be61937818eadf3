"""`nanoserve serve` on an embedder folder: it says what it serves, the OpenAI client gets its
embeddings (equal to the offline LLM's), and a chat request gets a 400 that says why."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ARGS = ("--max-batch", "4", "--kv-budget", "16MiB", "--grace-seconds", "2")


@pytest.fixture(scope="module")
def embedder(start_server: Callable[..., Any], tiny_embedder_dir: Path) -> Iterator[Any]:
    live = start_server(str(tiny_embedder_dir), *ARGS)
    yield live
    assert live.stop() == 0, live.log()


def test_health_models_and_boot_say_embed(embedder: Any) -> None:
    health = httpx.get(f"{embedder.url}/health", timeout=10).json()
    assert (health["task"], health["pooler"]) == (
        "embed",
        "embed: last pooling, normalized (modules.json)",
    )
    models = httpx.get(f"{embedder.url}/v1/models", timeout=10).json()
    assert models["data"][0]["task"] == "embed"
    assert "serving embed: last pooling, normalized (modules.json)" in embedder.log()


def test_the_openai_client_gets_the_offline_embeddings(
    embedder: Any, tiny_embedder_dir: Path
) -> None:
    import openai

    from nanoserve.runtime import LLM

    with openai.OpenAI(base_url=f"{embedder.url}/v1", api_key="unused", max_retries=0) as client:
        answer = client.embeddings.create(
            model=embedder_name(embedder), input=["hello world", "a fox"]
        )
        short = client.embeddings.create(model=embedder_name(embedder), input="a fox", dimensions=8)
    offline = LLM(  # the server's dtype (auto: bf16 where the CPU has it natively, a Zen 4)
        model=str(tiny_embedder_dir), kv_budget_bytes=1 << 22, max_batch=4, dtype="auto"
    ).embed(["hello world", "a fox"])
    assert [d.embedding for d in answer.data] == [o.embedding for o in offline]
    assert answer.usage.prompt_tokens == sum(len(o.prompt_token_ids) for o in offline)
    assert len(short.data[0].embedding) == 8
    metrics = httpx.get(f"{embedder.url}/metrics", timeout=10).text
    assert "nanoserve:pooling_requests_total 3.0" in metrics


def test_chat_on_an_embedder_is_a_400(
    embedder: Any, assert_openai_error: Callable[..., Any]
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    response = httpx.post(f"{embedder.url}/v1/chat/completions", json=body, timeout=30)
    error = assert_openai_error(response, 400, param="model")
    assert "serves embed, it does not generate" in error["message"]
    rerank = httpx.post(
        f"{embedder.url}/rerank", json={"query": "q", "documents": ["d"]}, timeout=30
    )
    assert "serves embed, not scores" in assert_openai_error(rerank, 400, param="model")["message"]


def embedder_name(embedder: Any) -> str:
    name: str = httpx.get(f"{embedder.url}/health", timeout=10).json()["model"]
    return name
