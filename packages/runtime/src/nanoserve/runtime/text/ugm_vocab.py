"""A Unigram vocabulary from a GGUF (`tokenizer.ggml.model` "t5": XLM-R and bge-m3, as
llama.cpp's converter writes them), as a `tokenizers` backend.

The file holds SentencePiece's pieces with their log-probabilities (`scores`), its normalizer
(`precompiled_charsmap`, NFKC-style rules), and two flags: `add_space_prefix` (a `▁` before the
text) and `remove_extra_whitespaces` (runs of spaces become one). Rebuilt here the way
transformers converts an XLM-R tokenizer: the charsmap, then the whitespace rule, then spaces
written `▁`, and the best segmentation by the pieces' scores (Viterbi). An input is framed by
the file's BOS and EOS ids (`<s> … </s>`) and a pair as RoBERTa's `<s> a </s></s> b </s>`: the
separator (`</s>`) between, as llama.cpp frames a rerank pair.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors

from nanoserve.runtime.errors import TokenizerError

SPACE = "\u2581"
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_BYTE = 6


def unigram_backend(metadata: Mapping[str, Any], source: str) -> tokenizers.Tokenizer:
    tokens = [str(t) for t in metadata.get("tokenizer.ggml.tokens") or ()]
    scores = list(metadata.get("tokenizer.ggml.scores") or ())
    types = list(metadata.get("tokenizer.ggml.token_type") or ())
    if not tokens or not len(tokens) == len(scores) == len(types):
        raise TokenizerError(
            source,
            f"a Unigram vocabulary needs as many scores and token types as tokens"
            f" ({len(tokens)} tokens, {len(scores)} scores, {len(types)} types)",
        )
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    if unk is None:
        unk = next((i for i, k in enumerate(types) if k == TOKEN_TYPE_UNKNOWN), None)
    model = models.Unigram(
        [(t, float(s)) for t, s in zip(tokens, scores, strict=True)],
        unk_id=None if unk is None else int(unk),
        byte_fallback=TOKEN_TYPE_BYTE in types,
    )
    backend = tokenizers.Tokenizer(model)
    steps: list[normalizers.Normalizer] = []
    if charsmap := metadata.get("tokenizer.ggml.precompiled_charsmap"):
        steps.append(normalizers.Precompiled(bytes(int(b) & 0xFF for b in charsmap)))
    if metadata.get("tokenizer.ggml.remove_extra_whitespaces", True):
        steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    backend.normalizer = normalizers.Sequence(steps)
    prefix = "always" if metadata.get("tokenizer.ggml.add_space_prefix", True) else "never"
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement=SPACE, prepend_scheme=prefix)
    backend.decoder = decoders.Metaspace(replacement=SPACE, prepend_scheme=prefix)
    controls = [t for t, k in zip(tokens, types, strict=True) if k == TOKEN_TYPE_CONTROL]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in controls])
    backend.post_processor = _frame(metadata, tokens, source)
    return backend


def _frame(
    metadata: Mapping[str, Any], tokens: list[str], source: str
) -> processors.TemplateProcessing:
    def token(key: str) -> tuple[str, int]:
        index = metadata.get(f"tokenizer.ggml.{key}_token_id")
        if index is None or not 0 <= int(index) < len(tokens):
            raise TokenizerError(source, f"the Unigram vocabulary names no {key} token")
        return tokens[int(index)], int(index)

    (bos, bos_id), (eos, eos_id) = token("bos"), token("eos")
    sep, sep_id = (
        token("seperator") if "tokenizer.ggml.seperator_token_id" in metadata else (eos, eos_id)
    )
    return processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} {sep} $B:1 {eos}:1",
        special_tokens=list({(bos, bos_id), (eos, eos_id), (sep, sep_id)}),
    )
