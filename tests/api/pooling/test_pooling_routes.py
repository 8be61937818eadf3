"""/v1/embeddings, /rerank (and /v1, /v2), /score over a FakeEngine (one token per character;
an embedding of (length, first id, last id, 0.5), a score of 1 / (1 + length)): the clients'
shapes, the inputs each route takes, and its refusals."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from nanoserve.runtime import RequestError, rerank_prompt
from tests.api.fake_engine import FakeEngine
from tests.api.fake_server import fake_server, openai_error

pytestmark = pytest.mark.anyio


async def test_embeddings_of_strings_and_token_ids() -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        one = (await client.post("/v1/embeddings", json={"input": "ab"})).json()
        many = (await client.post("/v1/embeddings", json={"input": ["ab", "xyz"]})).json()
        ids = (await client.post("/v1/embeddings", json={"input": [5, 6, 7]})).json()
        lists = (await client.post("/v1/embeddings", json={"input": [[5], [6, 7]]})).json()
    assert one == {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [2.0, 97.0, 98.0, 0.5]}],
        "model": fake.name,
        "usage": {"prompt_tokens": 2, "total_tokens": 2},
    }
    assert [d["embedding"] for d in many["data"]] == [
        [2.0, 97.0, 98.0, 0.5],
        [3.0, 120.0, 122.0, 0.5],
    ]
    assert many["usage"]["prompt_tokens"] == 5
    assert ids["data"][0]["embedding"] == [3.0, 5.0, 7.0, 0.5]
    assert [d["embedding"][0] for d in lists["data"]] == [1.0, 2.0]
    assert [p.task for _, _, p in fake.pooling_submitted] == ["embed"] * 6


async def test_base64_and_dimensions() -> None:
    fake = FakeEngine()
    async with fake_server(fake) as (client, _):
        body = {"input": "ab", "encoding_format": "base64", "dimensions": 2}
        answer = (await client.post("/v1/embeddings", json=body)).json()
    raw = base64.b64decode(answer["data"][0]["embedding"])
    assert struct.unpack("<2f", raw) == (2.0, 97.0)
    assert fake.pooling_submitted[0][2].dimensions == 2


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": []}, "input"),
        ({"input": [1, "a"]}, "input"),
        ({"input": [[1], "a"]}, "input"),
        ({"input": "a", "dimensions": 0}, "dimensions"),
        ({"input": "a", "encoding_format": "hex"}, None),
    ],
)
async def test_bad_embedding_inputs_are_400s(body: dict, param: str | None) -> None:
    async with fake_server() as (client, _):
        response = await client.post("/v1/embeddings", json=body)
    error = openai_error(response, 400)
    if param is not None:
        assert error["param"] == param


async def test_a_refusal_by_the_engine_is_a_400_naming_its_field() -> None:
    refusal = RequestError("model", "this model generates; it serves no embeddings or scores")
    async with fake_server(FakeEngine(refusals=[refusal])) as (client, _):
        response = await client.post("/v1/embeddings", json={"input": "a"})
    openai_error(response, 400, param="model")


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
async def test_rerank_sorts_by_relevance(path: str) -> None:
    fake = FakeEngine()
    documents: list[Any] = ["a much longer document", "short", {"text": "medium one"}]
    async with fake_server(fake) as (client, _):
        answer = (
            await client.post(path, json={"query": "q", "documents": documents, "top_n": 2})
        ).json()
        bare = await client.post(
            path, json={"query": "q", "documents": ["x"], "return_documents": False}
        )
    assert [r["index"] for r in answer["results"]] == [1, 2]  # shorter prompts score higher
    assert answer["results"][0]["document"] == {"text": "short"}
    prompt = rerank_prompt("q", "short")
    assert answer["results"][0]["relevance_score"] == pytest.approx(1 / (1 + len(prompt)))
    assert answer["usage"]["total_tokens"] == sum(
        len(rerank_prompt("q", d if isinstance(d, str) else d["text"])) for d in documents
    )
    assert fake.pooling_submitted[1][1] == [ord(c) for c in prompt]
    assert {p.task for _, _, p in fake.pooling_submitted} == {"score"}
    assert bare.json()["results"][0]["document"] is None


async def test_rerank_refusals() -> None:
    async with fake_server() as (client, _):
        empty = await client.post("/rerank", json={"query": "q", "documents": []})
        negative = await client.post(
            "/rerank", json={"query": "q", "documents": ["a"], "top_n": -1}
        )
    openai_error(empty, 400, param="documents")
    openai_error(negative, 400, param="top_n")


async def test_score_pairs_one_against_many_and_pairwise() -> None:
    async with fake_server() as (client, _):
        fan = (await client.post("/score", json={"text_1": "q", "text_2": ["a", "bb"]})).json()
        pairwise = (
            await client.post("/v1/score", json={"text_1": ["q", "r"], "text_2": ["a", "bb"]})
        ).json()
        mismatched = await client.post(
            "/score", json={"text_1": ["q", "r"], "text_2": ["a", "b", "c"]}
        )
    scores = [d["score"] for d in fan["data"]]
    assert scores == pytest.approx([1 / (1 + len(rerank_prompt("q", t))) for t in ("a", "bb")])
    assert [d["object"] for d in fan["data"]] == ["score", "score"]
    assert [d["score"] for d in pairwise["data"]] == pytest.approx(
        [1 / (1 + len(rerank_prompt(q, t))) for q, t in (("q", "a"), ("r", "bb"))]
    )
    openai_error(mismatched, 400, param="text_2")


async def test_a_long_input_list_goes_in_windows() -> None:
    """70 inputs: three windows of at most 32 in the engine, answered in order."""
    fake = FakeEngine()
    inputs = [[i + 1] * (i + 1) for i in range(70)]
    async with fake_server(fake) as (client, _):
        answer = (await client.post("/v1/embeddings", json={"input": inputs})).json()
    assert [d["embedding"][0] for d in answer["data"]] == [float(i + 1) for i in range(70)]
    assert [d["index"] for d in answer["data"]] == list(range(70))
    ids = [request_id for request_id, _, _ in fake.pooling_submitted]
    assert len(ids) == 70 and ids[-1].endswith("-69")
