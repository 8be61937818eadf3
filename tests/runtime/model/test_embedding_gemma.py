"""EmbeddingGemma (Gemma 3 with bidirectional attention, mean pooling, two Dense projections)
against transformers on a tiny random model: embeddings in float32 and on the kernels, alone
against batched, the window on both sides, and what such a model refuses."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from nanoserve.runtime import LLM
from nanoserve.runtime.engine.config.engine_config import EngineConfigError
from nanoserve.runtime.engine.config.speculative_config import SpeculativeConfig
from nanoserve.runtime.errors import ConfigError, UnsupportedModelError
from nanoserve.runtime.loading.model_config import ModelConfig
from tests.tiny_gemma_embedder import (
    WINDOW,
    make_tiny_embedding_gemma_dir,
    reference_embedding,
    write_tiny_embedding_gemma_gguf,
)

TEXTS = [
    "hello world",
    "the quick brown fox jumps over the lazy dog, and then the dog sleeps on the mat",
    "def main():\n    return 42\n",
]
SMALL: dict[str, object] = {"kv_budget_bytes": 1 << 22, "max_batch": 4}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_embedding_gemma_dir(tmp_path_factory.mktemp("embeddinggemma"))


@pytest.fixture(scope="module")
def llm(folder: Path) -> LLM:
    return LLM(str(folder), **SMALL)  # type: ignore[arg-type]


def test_the_config_reads_bidirectional_attention_and_halves_the_window(folder: Path) -> None:
    import json

    config = ModelConfig.from_hf(json.loads((folder / "config.json").read_text()))
    assert config.bidirectional and config.whole_inputs
    assert config.sliding_window == WINDOW // 2 + 1  # |i - j| < 4: three tokens each side
    assert config.sliding_layers == (0, 1, 2, 3, 4) and config.attention_layers == ()


def test_embeddings_match_transformers(llm: LLM, folder: Path) -> None:
    assert llm.engine.pooler.describe() == "embed: mean pooling, 2 dense, normalized (modules.json)"
    outs = llm.embed(TEXTS)
    assert len(outs[1].prompt_token_ids) > 2 * WINDOW  # the window masks some pairs
    for out in outs:
        assert out.embedding is not None and len(out.embedding) == 64
        expected = reference_embedding(folder, out.prompt_token_ids)
        torch.testing.assert_close(torch.tensor(out.embedding), expected, rtol=0, atol=2e-5)


def test_alone_equals_batched(llm: LLM) -> None:
    batched = [o.embedding for o in llm.embed(TEXTS)]
    alone = [llm.embed([text])[0].embedding for text in TEXTS]
    assert alone == batched


def test_on_the_kernels_in_q8(folder: Path) -> None:
    q8 = LLM(str(folder), quantize="q8", **SMALL)  # type: ignore[arg-type]
    for out in q8.embed(TEXTS):
        assert out.embedding is not None
        expected = reference_embedding(folder, out.prompt_token_ids)
        cosine = torch.nn.functional.cosine_similarity(torch.tensor(out.embedding), expected, dim=0)
        assert cosine.item() >= 0.999


@pytest.mark.parametrize("qtype", [None, "Q8_0"])
def test_a_gguf_in_llama_cpps_names_embeds_as_its_folder(
    folder: Path, tmp_path: Path, qtype: str | None
) -> None:
    import gguf

    kind = None if qtype is None else gguf.GGMLQuantizationType[qtype]
    path = write_tiny_embedding_gemma_gguf(folder, tmp_path / "embeddinggemma.gguf", kind)
    llm = LLM(str(path), **SMALL)  # type: ignore[arg-type]
    assert llm.engine.model.config.sliding_window == WINDOW // 2 + 1
    assert llm.engine.pooler.describe() == (
        "embed: mean pooling, 2 dense, normalized (GGUF gemma-embedding.pooling_type 1)"
    )
    bound = 0.9999 if qtype is None else 0.999
    for out in llm.embed(TEXTS):
        assert out.embedding is not None
        expected = reference_embedding(folder, out.prompt_token_ids)
        cosine = torch.nn.functional.cosine_similarity(torch.tensor(out.embedding), expected, dim=0)
        assert cosine.item() >= bound


def test_a_causal_window_would_differ(folder: Path) -> None:
    """The embedding depends on later tokens: the same prefix in a longer text embeds apart."""
    llm = LLM(str(folder), **SMALL)  # type: ignore[arg-type]
    short, long = llm.embed(["hello world", "hello world and more"])
    assert short.embedding is not None and long.embedding is not None
    assert short.embedding != long.embedding


def test_it_refuses_to_generate_or_draft(folder: Path) -> None:
    with pytest.raises(ConfigError, match="a model with bidirectional attention cannot generate"):
        LLM(str(folder), task="generate", **SMALL)  # type: ignore[arg-type]
    with pytest.raises(EngineConfigError, match="no --speculative-config"):
        LLM(str(folder), speculative=SpeculativeConfig.parse("ngram"), **SMALL)  # type: ignore[arg-type]


def test_bidirectional_attention_is_refused_outside_gemma3() -> None:
    config = {
        "model_type": "llama", "vocab_size": 32, "hidden_size": 16, "intermediate_size": 32,
        "num_hidden_layers": 1, "num_attention_heads": 2, "use_bidirectional_attention": True,
    }  # fmt: skip
    with pytest.raises(UnsupportedModelError, match="supported for Gemma 3"):
        ModelConfig.from_hf(config)
