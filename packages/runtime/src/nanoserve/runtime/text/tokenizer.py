"""Text to token ids and back, plus a streaming detokenizer that never splits a UTF-8 character.

`Tokenizer` wraps a `tokenizers.Tokenizer` built either from a Hugging Face `tokenizer.json` or from
a GGUF file's `tokenizer.ggml.*` metadata: GPT-2 style byte-level BPE ("gpt2": Llama 3, Qwen,
SmolLM), or a SentencePiece vocabulary ("llama": Gemma, Llama 2; "gemma4", the same spelling
merged by the file's ranks; spm_vocab.py). Either way the
result serialises to a `tokenizer.json` (`to_json`), which is how `convert.py` writes one.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors

from nanoserve.runtime.errors import TokenizerError
from nanoserve.runtime.text.spm_vocab import end_of_turn_ids, gemma4_backend, spm_backend
from nanoserve.runtime.text.ugm_vocab import unigram_backend
from nanoserve.runtime.text.wpm_vocab import wordpiece_backend

# llama.cpp's token types (`tokenizer.ggml.token_type`).
TOKEN_TYPE_CONTROL = 3  # special tokens: `<|im_start|>`, `<|endoftext|>`
TOKEN_TYPE_USER_DEFINED = 4  # added tokens matched whole in text, but not special

# Pre-tokenizer regexes, named by `tokenizer.ggml.pre`; the same ones llama.cpp and transformers use.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp's `pre` names for plain GPT-2 splitting, and for GPT-2 splitting after every digit
# (`\p{N}` first, as SmolLM2's own tokenizer.json does with `Digits(individual_digits=True)`).
_GPT2_PRES = frozenset({"default", "gpt2", "mpt", "olmo", "jais"})
_DIGIT_THEN_GPT2_PRES = frozenset({"smollm", "starcoder", "refact", "command-r", "codeshell"})
_SPLIT_PRES = {
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
}


class Tokenizer:
    """Encode/decode with one model's vocabulary; knows which ids end a sequence."""

    __slots__ = ("_backend", "_bos_token_id", "_eos_token_ids")

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        eos_token_ids: Sequence[int],
        bos_token_id: int | None,
    ) -> None:
        self._backend = backend
        self._eos_token_ids = tuple(eos_token_ids)
        self._bos_token_id = bos_token_id

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, eos_token_ids: Sequence[int], bos_token_id: int | None
    ) -> Tokenizer:
        """Load a Hugging Face `tokenizer.json`."""
        if not os.path.isfile(path):
            raise TokenizerError(path, "file not found")
        try:
            backend = tokenizers.Tokenizer.from_file(os.fspath(path))
        except Exception as error:  # tokenizers raises a bare Exception for malformed JSON
            raise TokenizerError(path, f"cannot parse tokenizer.json: {error}") from None
        return cls(backend, eos_token_ids=eos_token_ids, bos_token_id=bos_token_id)

    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], *, source: str) -> Tokenizer:
        """Rebuild the tokenizer a GGUF file describes in `tokenizer.ggml.*`."""
        model = metadata.get("tokenizer.ggml.model")
        if model in ("llama", "gemma4"):  # SentencePiece's spelling (Gemma 4's with merges)
            return cls._from_spm_metadata(metadata, source, gemma4=model == "gemma4")
        if model in ("bert", "t5"):  # an encoder's: framed by its post-processor
            make = wordpiece_backend if model == "bert" else unigram_backend
            return cls(make(metadata, source), eos_token_ids=(), bos_token_id=None)
        if model != "gpt2":
            raise TokenizerError(
                source,
                f"tokenizer.ggml.model={model!r}: only 'gpt2' (byte-level BPE), 'llama'"
                " (SentencePiece), 'gemma4' (SentencePiece's spelling, merged by rank),"
                " 'bert' (WordPiece) and 't5' (Unigram) are supported",
            )
        tokens: list[str] = list(_required(metadata, "tokenizer.ggml.tokens", source))
        merges: list[str] = list(_required(metadata, "tokenizer.ggml.merges", source))
        token_types: list[int] = list(metadata.get("tokenizer.ggml.token_type") or [])
        pre = metadata.get("tokenizer.ggml.pre") or "default"

        alphabet = _bytes_to_unicode()
        # One regex over the whole alphabet: ~2x a per-token set() on a 150k vocabulary.
        spelled = re.compile("[" + re.escape("".join(alphabet.values())) + "]*").fullmatch
        # Tokens are stored in GPT-2's byte alphabet already; respell any that are not (as
        # transformers does) so every vocabulary entry is something the BPE can produce.
        vocab = {
            token if spelled(token) else "".join(alphabet[b] for b in token.encode()): idx
            for idx, token in enumerate(tokens)
        }
        split = [merge.split(" ") for merge in merges]
        if bad := next((m for m, p in zip(merges, split, strict=True) if len(p) != 2), None):
            raise TokenizerError(source, f"merge {bad!r} is not two space-separated tokens")
        pairs = [(p[0], p[1]) for p in split]
        try:
            bpe = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False)
        except Exception as error:  # e.g. a merge of tokens the vocabulary lacks
            raise TokenizerError(
                source, f"inconsistent BPE vocabulary and merges: {error}"
            ) from None
        backend = tokenizers.Tokenizer(bpe)
        backend.pre_tokenizer = _pre_tokenizer(pre, source)
        backend.decoder = decoders.ByteLevel()

        # Control tokens become special (matched whole, droppable on decode); a control token that
        # is not spelled in the byte alphabet is a llama.cpp mislabel, skipped like transformers does.
        kinds = dict(zip(tokens, token_types, strict=False))
        special = [t for t, k in kinds.items() if k == TOKEN_TYPE_CONTROL and spelled(t)]
        user = [t for t, k in kinds.items() if k == TOKEN_TYPE_USER_DEFINED and t in vocab]
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
        backend.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])

        return cls._finish(backend, metadata, tokens, source)

    @classmethod
    def _from_spm_metadata(
        cls, metadata: Mapping[str, Any], source: str, gemma4: bool = False
    ) -> Tokenizer:
        tokens: list[str] = list(_required(metadata, "tokenizer.ggml.tokens", source))
        try:
            backend = (gemma4_backend if gemma4 else spm_backend)(metadata, source)
        except Exception as error:  # tokenizers raises a bare Exception for a bad vocabulary
            if isinstance(error, TokenizerError):
                raise
            raise TokenizerError(
                source, f"inconsistent SentencePiece vocabulary: {error}"
            ) from None
        if gemma4:  # llama.cpp begins every Gemma 4 sequence with its BOS, whatever the file says
            metadata = {**metadata, "tokenizer.ggml.add_bos_token": True}
        return cls._finish(backend, metadata, tokens, source, extra_eos=end_of_turn_ids(metadata))

    @classmethod
    def _finish(
        cls,
        backend: tokenizers.Tokenizer,
        metadata: Mapping[str, Any],
        tokens: Sequence[str],
        source: str,
        extra_eos: Sequence[int] = (),
    ) -> Tokenizer:
        """The ids that end and begin a sequence, checked, and the BOS the file asks for."""
        bos = metadata.get("tokenizer.ggml.bos_token_id")
        # llama.cpp stops on end-of-turn as well as end-of-sequence; most files name only the latter.
        eos_ids = [metadata.get(f"tokenizer.ggml.{k}_token_id") for k in ("eos", "eot")]
        for token_id in (bos, *eos_ids):
            if token_id is not None and not 0 <= token_id < len(tokens):
                raise TokenizerError(
                    source, f"token id {token_id} is outside the {len(tokens)}-token vocabulary"
                )
        if metadata.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
            backend.post_processor = _prepend(tokens[bos], bos)
        ids = (*eos_ids, *extra_eos)
        eos_token_ids = tuple(dict.fromkeys(int(i) for i in ids if i is not None))
        return cls(backend, eos_token_ids=eos_token_ids, bos_token_id=bos)

    def __repr__(self) -> str:  # the backend's own repr prints the whole vocabulary
        return (
            f"Tokenizer(vocab_size={self.vocab_size}, eos_token_ids={self._eos_token_ids}, "
            f"bos_token_id={self._bos_token_id})"
        )

    # -- the interface the engine uses ------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; special-token text (`<|im_start|>`) maps to its id.

        `add_special_tokens` adds what the model's post-processor adds (a BOS for Llama-3, nothing
        for SmolLM2); chat prompts rendered from a template already contain theirs, so pass False.
        """
        return self._backend.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_pair(self, first: str, second: str) -> list[int]:
        """Token ids of a text pair as the post-processor joins two segments (BERT's
        `[CLS] a [SEP] b [SEP]`, RoBERTa's `<s> a </s></s> b </s>`): a cross-encoder's input."""
        return self._backend.encode(first, second, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return self._backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos_token_ids

    @property
    def bos_token_id(self) -> int | None:
        return self._bos_token_id

    @property
    def vocab_size(self) -> int:
        """Ids the tokenizer can produce (the model's embedding may have more rows)."""
        return self._backend.get_vocab_size(with_added_tokens=True)

    def token_to_id(self, token: str) -> int | None:
        return self._backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._backend.id_to_token(token_id)

    def special_token_ids(self) -> frozenset[int]:
        return frozenset(
            i for i, t in self._backend.get_added_tokens_decoder().items() if t.special
        )

    def to_json(self) -> str:
        """The whole tokenizer as a Hugging Face `tokenizer.json` document."""
        return self._backend.to_str(pretty=False)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        return self._backend


class IncrementalDetokenizer:
    """Turn a stream of token ids into text pieces whose concatenation is `decode(all_ids)`.

    Each `push` re-decodes a short window: the ids from the previous emission's start to now, and
    emits the text past what that window already produced. Text whose tail is U+FFFD (an incomplete
    UTF-8 sequence, e.g. the first bytes of an emoji) is held back until a later token completes it;
    `flush` releases whatever is left. The window starts one emission back, not at the last emitted
    id, because decoders such as sentencepiece's strip a leading space from the first token.
    """

    __slots__ = ("_ids", "_prefix_idx", "_read_idx", "_skip_special_tokens", "_tokenizer")

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = False) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_idx = 0  # window start: a point where the decoded text ended cleanly
        self._read_idx = 0  # ids before this are already emitted

    def push(self, token_id: int) -> str:
        """Add one id; return the text it completes (often "", never a broken character)."""
        self._ids.append(token_id)
        return self._emit(final=False)

    def flush(self) -> str:
        """Return everything not yet emitted, an incomplete character included (as U+FFFD)."""
        return self._emit(final=True)

    @property
    def token_ids(self) -> list[int]:
        return list(self._ids)

    def _emit(self, *, final: bool) -> str:
        skip = self._skip_special_tokens
        window = self._ids[self._prefix_idx :]
        done = self._tokenizer.decode(
            self._ids[self._prefix_idx : self._read_idx], skip_special_tokens=skip
        )
        text = self._tokenizer.decode(window, skip_special_tokens=skip)
        if len(text) <= len(done) or (text.endswith("\ufffd") and not final):
            return ""
        self._prefix_idx, self._read_idx = self._read_idx, len(self._ids)
        return text[len(done) :]


def _pre_tokenizer(pre: str, source: str) -> pre_tokenizers.PreTokenizer:
    if pre in _GPT2_PRES:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGIT_THEN_GPT2_PRES:
        # llama.cpp splits `\p{N}` first, then the GPT-2 regex: a space before a digit stays with
        # the space run before it ("x  1" -> "x", "ĠĠ", "1"), as in SmolLM2's own tokenizer.json.
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
    if pre in _SPLIT_PRES:
        return pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_SPLIT_PRES[pre]), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    known = sorted(_GPT2_PRES | _DIGIT_THEN_GPT2_PRES | _SPLIT_PRES.keys())
    raise TokenizerError(source, f"tokenizer.ggml.pre={pre!r} is not supported (known: {known})")


def _prepend(token: str, token_id: int) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(
        single=f"{token}:0 $A:0",
        pair=f"{token}:0 $A:0 {token}:1 $B:1",
        special_tokens=[(token, token_id)],
    )


def _required(metadata: Mapping[str, Any], key: str, source: str) -> Any:
    if key not in metadata:
        raise TokenizerError(source, f"GGUF metadata has no {key!r}")
    return metadata[key]


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table: byte-level BPE vocabularies are spelled in it."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {b: chr(b) for b in printable}
    shifted = (b for b in range(256) if b not in table)
    for n, b in enumerate(shifted):
        table[b] = chr(256 + n)
    return table
