"""A GGUF's WordPiece vocabulary (llama.cpp's `▁`-marked spelling) tokenizes as BERT's own."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer as HfTokenizer

from nanoserve.runtime.loading.checkpoint import load_checkpoint
from nanoserve.runtime.text.wpm_vocab import bert_piece
from tests import tiny_encoders


def test_bert_piece() -> None:
    assert [bert_piece(t) for t in ("[CLS]", "\u2581play", "ing", "\u2581a")] == [
        "[CLS]",
        "play",
        "##ing",
        "a",
    ]


@pytest.mark.parametrize(
    "text", ["Hello World", "the CAT sat on the mat.", "dogs?", "Émile, queried!", ""]
)
def test_the_gguf_tokenizes_as_the_folder(tmp_path: Path, text: str) -> None:
    folder = tiny_encoders.make_tiny_encoder_dir(tmp_path, "bert")
    gguf = tiny_encoders.write_tiny_encoder_gguf(folder, tmp_path / "bert.gguf")
    reference = HfTokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer = load_checkpoint(gguf).tokenizer
    assert tokenizer.encode(text) == reference.encode(text).ids
    assert tokenizer.encode_pair(text, "a dog") == reference.encode(text, "a dog").ids
