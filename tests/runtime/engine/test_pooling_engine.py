"""Pooling requests through the engine: embeddings and scores on tiny Qwen3 checkpoints,
against transformers on the same weights; chunked = whole, alone = beside generation; what
each task refuses."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from nanoserve.runtime import LLM, PoolingParams, RequestError
from nanoserve.runtime.engine.engine import Engine
from nanoserve.runtime.engine.requests.sampling_params import SamplingParams

TEXTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog",
    "def main():\n    return 42\n",
]
SMALL: dict[str, Any] = {"kv_budget_bytes": 1 << 22, "max_batch": 4}


def reference_hidden(model_dir: Path, ids: list[int]) -> torch.Tensor:
    """transformers' final-normed hidden states of ids: [tokens, hidden]."""
    import transformers

    model = transformers.AutoModel.from_pretrained(model_dir)
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).last_hidden_state[0]


@pytest.fixture(scope="module")
def last_dir(
    tmp_path_factory: pytest.TempPathFactory, make_tiny_embedder_dir: Callable[..., Path]
) -> Path:
    return make_tiny_embedder_dir(tmp_path_factory.mktemp("embed"), "lasttoken")


@pytest.fixture(scope="module")
def mean_dir(
    tmp_path_factory: pytest.TempPathFactory, make_tiny_embedder_dir: Callable[..., Path]
) -> Path:
    return make_tiny_embedder_dir(tmp_path_factory.mktemp("embed"), "mean_tokens", dense=32)


@pytest.fixture(scope="module")
def last_llm(last_dir: Path) -> LLM:
    return LLM(model=str(last_dir), **SMALL)


def test_last_token_embeddings_match_transformers(last_llm: LLM, last_dir: Path) -> None:
    assert last_llm.engine.pooler.describe() == "embed: last pooling, normalized (modules.json)"
    for out in last_llm.embed(TEXTS):
        expected = torch.nn.functional.normalize(
            reference_hidden(last_dir, out.prompt_token_ids)[-1], dim=0
        )
        assert out.embedding is not None and len(out.embedding) == 64
        torch.testing.assert_close(torch.tensor(out.embedding), expected, rtol=0, atol=2e-6)


def test_mean_pooling_and_dense_match_transformers_however_chunked(
    mean_dir: Path, make_tiny_embedder_dir: Callable[..., Path]
) -> None:
    from safetensors.torch import load_file

    dense = load_file(str(mean_dir / "2_Dense" / "model.safetensors"))
    whole = LLM(model=str(mean_dir), **SMALL).embed(TEXTS)
    chunked = LLM(model=str(mean_dir), max_num_batched_tokens=5, **SMALL).embed(TEXTS)
    for out, cut in zip(whole, chunked, strict=True):
        hidden = reference_hidden(mean_dir, out.prompt_token_ids).double().mean(0).float()
        projected = torch.tanh(hidden @ dense["linear.weight"].T + dense["linear.bias"])
        expected = torch.nn.functional.normalize(projected, dim=0)
        assert out.embedding is not None and cut.embedding is not None
        torch.testing.assert_close(torch.tensor(out.embedding), expected, rtol=0, atol=2e-6)
        assert max(abs(a - b) for a, b in zip(out.embedding, cut.embedding, strict=True)) < 1e-6


def test_an_embedding_alone_equals_one_beside_generation(last_llm: LLM) -> None:
    """Bit for bit: pooling rows share steps with a prompt's chunks and decode rows (an engine
    that both generates and pools, as a chat model with --task embed could)."""
    alone = [o.embedding for o in last_llm.embed(TEXTS)]
    source = last_llm.engine
    engine = Engine(source.model, source.tokenizer, source.config, pooler=source.pooler)
    engine.generates = True
    encode = source.tokenizer.encode
    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    engine.add_request("g", encode("a prompt to continue"), greedy)
    # the generating prompt goes first: the pooling rows join its decode steps
    generated = [t for delta in engine.step() for t in delta.token_ids]
    for i, text in enumerate(TEXTS):
        engine.add_request(f"e{i}", encode(text), PoolingParams())
    answers = {}
    while engine.has_unfinished:
        for delta in engine.step():
            if delta.pooled is not None:
                answers[delta.request_id] = list(delta.pooled)
            generated.extend(delta.token_ids)
    assert [answers[f"e{i}"] for i in range(len(TEXTS))] == alone
    assert len(generated) == 12
    assert engine.blocks.num_in_use == 0
    engine.check_blocks()
    status = engine.status()
    assert (status.task, status.pooling_requests) == ("embed", 3)
    assert status.pooling_tokens == sum(len(encode(t)) for t in TEXTS)


def test_dimensions_truncate_and_renormalize(last_llm: LLM) -> None:
    full = torch.tensor(last_llm.embed(TEXTS[0])[0].embedding)
    short = torch.tensor(last_llm.embed(TEXTS[0], dimensions=8)[0].embedding)
    torch.testing.assert_close(
        short, torch.nn.functional.normalize(full[:8], dim=0), rtol=0, atol=1e-6
    )
    raw = last_llm.embed(TEXTS[0], normalize=False)[0].embedding
    assert raw is not None and abs(torch.tensor(raw).norm().item() - 1.0) > 1e-3
    with pytest.raises(RequestError, match="must be at most the embedding's 64, got 65"):
        last_llm.embed(TEXTS[0], dimensions=65)


def test_each_task_refuses_the_others(
    last_llm: LLM, make_tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    with pytest.raises(RequestError, match="serves embed, it does not generate"):
        last_llm.generate("hi")
    with pytest.raises(RequestError, match="serves embed, not scores"):
        last_llm.score("a", "b")
    with pytest.raises(RequestError, match="the input is empty"):
        last_llm.embed([[]])
    with pytest.raises(RequestError, match=r"exceeds the \d+-token limit"):
        last_llm.embed([[1] * 100_000])
    generating = LLM(model=str(make_tiny_model_dir(tmp_path, "qwen3")), **SMALL)
    with pytest.raises(RequestError, match="this model generates; it serves no embeddings"):
        generating.embed("hi")
    assert last_llm.engine.blocks.num_in_use == 0


def test_task_embed_on_a_generative_checkpoint(
    make_tiny_model_dir: Callable[..., Path], tmp_path: Path
) -> None:
    """--task embed: a decoder pools its last token and normalizes (vLLM's default)."""
    model_dir = make_tiny_model_dir(tmp_path, "qwen3")
    llm = LLM(model=str(model_dir), task="embed", **SMALL)
    assert llm.engine.pooler.describe() == "embed: last pooling, normalized (--task embed)"
    out = llm.embed(TEXTS[1])[0]
    expected = torch.nn.functional.normalize(
        reference_hidden(model_dir, out.prompt_token_ids)[-1], dim=0
    )
    torch.testing.assert_close(torch.tensor(out.embedding), expected, rtol=0, atol=2e-6)


def test_a_classification_head_scores_pairs(
    make_tiny_classifier_dir: Callable[..., Path], tmp_path: Path
) -> None:
    import transformers

    from nanoserve.runtime import rerank_prompt

    model_dir = make_tiny_classifier_dir(tmp_path)
    llm = LLM(model=str(model_dir), **SMALL)
    assert llm.engine.pooler.describe() == (
        "rerank: last pooling, classification head (Qwen3ForSequenceClassification)"
    )
    scores = llm.score("what is a fox", ["a fox is an animal", "def main(): pass"])
    reference = transformers.AutoModelForSequenceClassification.from_pretrained(model_dir)
    for out, document in zip(scores, ["a fox is an animal", "def main(): pass"], strict=True):
        ids = llm.tokenizer.encode(
            rerank_prompt("what is a fox", document), add_special_tokens=False
        )
        assert out.prompt_token_ids == ids
        with torch.no_grad():
            logit = reference(input_ids=torch.tensor([ids])).logits[0, 0]
        assert out.score == pytest.approx(torch.sigmoid(logit).item(), abs=1e-6)
    with pytest.raises(RequestError, match="2 first texts cannot be paired with 3 second"):
        llm.score(["a", "b"], ["c", "d", "e"])
    with pytest.raises(RequestError, match="serves rerank, it does not generate"):
        llm.generate("hi", SamplingParams(max_tokens=2))
