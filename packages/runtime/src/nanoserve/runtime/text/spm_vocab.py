"""A GGUF's SentencePiece vocabulary (`tokenizer.ggml.model` "llama": Gemma, Llama 2) as a
`tokenizers` BPE with byte fallback, which is how transformers converts one.

llama.cpp tokenizes such a vocabulary by merging, again and again, the adjacent pair whose
joined text is a token of the highest score (the leftmost on a tie), then spelling what is
left over in byte tokens (`<0x41>`). A BPE whose merges are every split of a token into two
tokens, ranked by the joined token's score, merges in the same order. Spaces are written `▁`
(U+2581), with one put in front where the file says `add_space_prefix`. User-defined tokens
(Gemma's runs of newlines) are matched whole in the raw text first, as llama.cpp does.

Gemma 4's vocabulary (`tokenizer.ggml.model` "gemma4") is spelled the same way, but the file
holds its merges (`tokenizer.ggml.merges`, "a b" by rank), which llama.cpp applies as they
stand: over the text's characters (not GPT-2's byte alphabet), within each run of newlines and
each run of anything else (its `[^\n]+|[\n]+`), with no space put in front, and byte tokens
for what no merge reaches (`gemma4_backend`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from nanoserve.runtime.errors import TokenizerError

SPACE = "\u2581"  # SentencePiece's visible space
TOKEN_TYPE_NORMAL = 1
TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4
TOKEN_TYPE_BYTE = 6
# Control tokens that end a turn, by text: llama.cpp stops on these as on end-of-sequence, where
# a file names only the latter (Gemma's files name <eos>, and turns end in <end_of_turn>).
# Gemma 4 ends a turn with <turn|>, and stops at <|tool_response>, where a tool's answer is due.
END_OF_TURN_TEXTS = frozenset(
    {"<end_of_turn>", "<|eot_id|>", "<|im_end|>", "<|end|>", "<EOT>", "<turn|>", "<|tool_response>"}
)
NEWLINE_RUNS = r"[^\n]+|[\n]+"  # Gemma 4's pre-split: runs of newlines, runs of anything else


def spm_backend(metadata: Mapping[str, Any], source: str) -> tokenizers.Tokenizer:
    """The tokenizers.Tokenizer of a SentencePiece GGUF vocabulary (no post-processor)."""
    tokens, scores, types = _vocabulary(metadata, source)
    vocab = _ids(tokens, source)
    space_prefix = bool(metadata.get("tokenizer.ggml.add_space_prefix", True))
    merges = _merges(tokens, scores, types, vocab)
    return _backend(tokens, types, vocab, merges, space_prefix, newline_runs=False)


def gemma4_backend(metadata: Mapping[str, Any], source: str) -> tokenizers.Tokenizer:
    """The tokenizers.Tokenizer of Gemma 4's GGUF vocabulary: the file's own merges, applied
    within runs of newlines and runs of anything else, no space in front."""
    tokens, _, types = _vocabulary(metadata, source)
    vocab = _ids(tokens, source)
    stored = metadata.get("tokenizer.ggml.merges")
    if not stored:
        raise TokenizerError(source, "a 'gemma4' vocabulary without tokenizer.ggml.merges")
    merges: list[tuple[str, str]] = []
    for merge in stored:
        cut = merge.find(" ", 1)  # a merge's left part may itself be a lone space
        if cut < 0:
            raise TokenizerError(source, f"merge {merge!r} is not two space-separated tokens")
        merges.append((merge[:cut], merge[cut + 1 :]))
    return _backend(tokens, types, vocab, merges, space_prefix=False, newline_runs=True)


def _vocabulary(
    metadata: Mapping[str, Any], source: str
) -> tuple[list[str], Sequence[float], Sequence[int]]:
    tokens: list[str] = list(metadata["tokenizer.ggml.tokens"])
    scores: Sequence[float] = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types: Sequence[int] = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if not len(scores) == len(types) == len(tokens):
        raise TokenizerError(
            source,
            f"{len(tokens)} tokens, {len(scores)} scores and {len(types)} token types disagree",
        )
    return tokens, scores, types


def _ids(tokens: Sequence[str], source: str) -> dict[str, int]:
    """Each text's id (a repeated text is reached by its first), byte tokens checked."""
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    missing_bytes = [b for b in range(256) if f"<0x{b:02X}>" not in vocab]
    if missing_bytes:
        raise TokenizerError(
            source, f"a SentencePiece vocabulary without byte tokens (<0x{missing_bytes[0]:02X}>)"
        )
    return vocab


def _backend(
    tokens: Sequence[str],
    types: Sequence[int],
    vocab: dict[str, int],
    merges: list[tuple[str, str]],
    space_prefix: bool,
    newline_runs: bool,
) -> tokenizers.Tokenizer:
    unknown = next((t for t, k in zip(tokens, types, strict=True) if k == TOKEN_TYPE_UNKNOWN), None)
    bpe = models.BPE(
        vocab=vocab, merges=merges, unk_token=unknown, fuse_unk=True, byte_fallback=True
    )
    backend = tokenizers.Tokenizer(bpe)
    escape: list[normalizers.Normalizer] = [normalizers.Replace(" ", SPACE)]
    if space_prefix:
        escape.insert(0, normalizers.Prepend(SPACE))
    backend.normalizer = normalizers.Sequence(escape)
    if newline_runs:
        backend.pre_tokenizer = pre_tokenizers.Split(Regex(NEWLINE_RUNS), "isolated")
    steps: list[decoders.Decoder] = [
        decoders.Replace(SPACE, " "),
        decoders.ByteFallback(),
        decoders.Fuse(),
    ]
    if space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    backend.decoder = decoders.Sequence(steps)
    special = [t for t, k in zip(tokens, types, strict=True) if k == TOKEN_TYPE_CONTROL]
    user = [t for t, k in zip(tokens, types, strict=True) if k == TOKEN_TYPE_USER_DEFINED]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    return backend


def _merges(
    tokens: Sequence[str], scores: Sequence[float], types: Sequence[int], vocab: Mapping[str, int]
) -> list[tuple[str, str]]:
    """Every split of a normal token into two tokens, the joined token's highest score first
    (then its id, then the shorter left part: a fixed order for the rare tie)."""
    ranked: list[tuple[float, int, int]] = []  # (-score, token id, cut): a 500k-item sort
    add, known = ranked.append, vocab.__contains__
    for index, (token, score, kind) in enumerate(zip(tokens, scores, types, strict=True)):
        if kind != TOKEN_TYPE_NORMAL or len(token) < 2 or vocab[token] != index:
            continue
        for cut in range(1, len(token)):
            if known(token[:cut]) and known(token[cut:]):
                add((-score, index, cut))
    ranked.sort()
    return [(tokens[i][:cut], tokens[i][cut:]) for _, i, cut in ranked]


def end_of_turn_ids(metadata: Mapping[str, Any]) -> list[int]:
    """The control tokens that end a turn, by their text (see END_OF_TURN_TEXTS)."""
    tokens = metadata.get("tokenizer.ggml.tokens") or []
    types = metadata.get("tokenizer.ggml.token_type") or []
    return [
        i
        for i, (t, k) in enumerate(zip(tokens, types, strict=False))
        if k == TOKEN_TYPE_CONTROL and t in END_OF_TURN_TEXTS
    ]
