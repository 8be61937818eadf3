"""A GGUF's Unigram vocabulary (`t5`, as llama.cpp writes XLM-R's) tokenizes as the
tokenizer.json it was written from: single inputs, pairs, runs of spaces; bad metadata is a
TokenizerError naming what is missing."""

from __future__ import annotations

from typing import Any

import pytest

from nanoserve.runtime.errors import TokenizerError
from nanoserve.runtime.text.tokenizer import Tokenizer
from tests.tiny_encoders import unigram_tokenizer

TEXTS = ["hello world", "the  cat   sat on the mat.", "a query, a document?", "zebra!", " lead"]


@pytest.fixture(scope="module")
def metadata() -> dict[str, Any]:
    vocab = unigram_tokenizer().to_str()
    import json

    pieces = json.loads(vocab)["model"]["vocab"]
    return {
        "tokenizer.ggml.model": "t5",
        "tokenizer.ggml.tokens": [p for p, _ in pieces],
        "tokenizer.ggml.scores": [s for _, s in pieces],
        "tokenizer.ggml.token_type": [3, 3, 3, 2] + [1] * (len(pieces) - 4),
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.seperator_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 3,
        "tokenizer.ggml.add_space_prefix": True,
        "tokenizer.ggml.remove_extra_whitespaces": True,
    }


def test_ids_equal_the_folder_tokenizers(metadata: dict[str, Any]) -> None:
    folder = unigram_tokenizer()
    ours = Tokenizer.from_gguf_metadata(metadata, source="x.gguf")
    for text in TEXTS:
        assert ours.encode(text) == folder.encode(text).ids
    assert ours.encode_pair("the cat", "a dog") == folder.encode("the cat", "a dog").ids
    assert ours.encode_pair("q", "d")[:1] == [0] and ours.encode_pair("q", "d")[-1] == 2


def test_missing_scores_or_frame_are_named(metadata: dict[str, Any]) -> None:
    with pytest.raises(TokenizerError, match="as many scores"):
        Tokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.scores": []}, source="x")
    without_bos = {k: v for k, v in metadata.items() if k != "tokenizer.ggml.bos_token_id"}
    with pytest.raises(TokenizerError, match="names no bos token"):
        Tokenizer.from_gguf_metadata(without_bos, source="x")
