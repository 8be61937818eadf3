"""A WordPiece vocabulary from a GGUF (`tokenizer.ggml.model` "bert"), as a `tokenizers` backend.

llama.cpp's converter respells BERT's vocabulary: a piece that begins a word gets a leading `▁`
and a continuation loses its `##`, so `▁play` + `ing` is `play` + `##ing`; bracketed tokens
(`[CLS]`) are kept as they are. Undone here, the vocabulary is BERT's again, and it is
tokenized as llama.cpp's WPM tokenizer does: lower-cased with accents stripped, split on
whitespace and punctuation, each word by longest match, an input framed as `[CLS] … [SEP]`
(a pair as `[CLS] a [SEP] b [SEP]`) by the file's cls and separator ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tokenizers
from tokenizers import AddedToken, decoders, models, normalizers, pre_tokenizers, processors

from nanoserve.runtime.errors import TokenizerError

TOKEN_TYPE_CONTROL = 3
WORD_START = "\u2581"


def bert_piece(token: str) -> str:
    """A GGUF token as BERT's vocabulary spells it."""
    if token.startswith("[") and token.endswith("]"):
        return token
    return token[1:] if token.startswith(WORD_START) else f"##{token}"


def wordpiece_backend(metadata: Mapping[str, Any], source: str) -> tokenizers.Tokenizer:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if not tokens:
        raise TokenizerError(source, "GGUF metadata has no tokenizer.ggml.tokens")
    pieces = [bert_piece(str(t)) for t in tokens]
    vocab: dict[str, int] = {}
    for index, piece in enumerate(pieces):
        vocab.setdefault(piece, index)  # a duplicate keeps its first id, as llama.cpp's map

    def special(key: str, fallback: str) -> tuple[str, int]:
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if index is None:
            index = vocab.get(fallback)
        if index is None or not 0 <= int(index) < len(pieces):
            raise TokenizerError(source, f"the WordPiece vocabulary has no {fallback} token")
        return pieces[int(index)], int(index)

    unk = special("unknown", "[UNK]")[0]
    backend = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token=unk))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True, strip_accents=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.decoder = decoders.WordPiece()
    # llama.cpp keeps [CLS] as the BOS id, [SEP] as the separator
    (cls, cls_id), (sep, sep_id) = special("bos", "[CLS]"), special("seperator", "[SEP]")
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, cls_id), (sep, sep_id)],
    )
    types = list(metadata.get("tokenizer.ggml.token_type") or [])
    controls = [p for p, t in zip(pieces, types, strict=False) if t == TOKEN_TYPE_CONTROL]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in controls])
    return backend
