"""A SentencePiece GGUF vocabulary as a BPE: the ids llama.cpp's own algorithm gives (merge the
best-scored adjacent pair until none is a token, then spell leftovers in bytes), on a tiny
vocabulary written here; the real Gemma 3 file is checked against transformers in
tests/runtime/model/test_gemma3_file.py."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.runtime.errors import TokenizerError
from nanoserve.runtime.text.spm_vocab import SPACE
from nanoserve.runtime.text.tokenizer import Tokenizer

NORMAL, UNKNOWN, CONTROL, USER, BYTE = 1, 2, 3, 4, 6
# (text, score): distinct scores, so the merge order is the scores' alone.
PIECES = [
    (SPACE, -1.0),
    ("a", -2.0),
    ("b", -3.0),
    ("c", -4.0),
    ("d", -5.0),
    ("é", -6.0),
    ("ab", -10.0),
    ("bc", -9.5),  # beats "ab": "abc" merges b+c first
    ("abc", -11.0),
    (SPACE + "a", -8.0),
    (SPACE + "ab", -12.0),
    ("cd", -13.0),
    ("aa", -7.0),
    (SPACE + SPACE, -14.0),
    ("dd", -15.0),
    ("ddd", -16.0),
]


def metadata(add_space_prefix: bool = False, **changes: Any) -> dict[str, Any]:
    tokens = ["<unk>", "<s>", "</s>", "<end_of_turn>", "\n\n"]
    types = [UNKNOWN, CONTROL, CONTROL, CONTROL, USER]
    scores = [0.0, 0.0, 0.0, 0.0, 0.0]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [BYTE] * 256
    scores += [0.0] * 256
    tokens += [t for t, _ in PIECES]
    types += [NORMAL] * len(PIECES)
    scores += [s for _, s in PIECES]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.ggml.add_space_prefix": add_space_prefix,
        **changes,
    }


def llamacpp_spm(text: str, meta: dict[str, Any]) -> list[int]:
    """llama.cpp's llm_tokenizer_spm, plainly: user-defined tokens split out first, then the
    highest-scored mergeable adjacent pair (leftmost on a tie), then bytes for leftovers."""
    tokens, types, scores = (
        meta[f"tokenizer.ggml.{k}"] for k in ("tokens", "token_type", "scores")
    )
    ids = {t: i for i, t in enumerate(tokens)}
    user = [t for t, k in zip(tokens, types, strict=True) if k == USER]
    out: list[int] = []
    pieces = [text]
    for token in user:
        pieces = [p for piece in pieces for p in _split_keep(piece, token)]
    for index, piece in enumerate(pieces):
        if piece in user:
            out.append(ids[piece])
            continue
        prefix = SPACE if meta["tokenizer.ggml.add_space_prefix"] and index == 0 else ""
        symbols = list(prefix + piece.replace(" ", SPACE))
        while True:
            best: tuple[float, int] | None = None
            for i in range(len(symbols) - 1):
                joined = symbols[i] + symbols[i + 1]
                if joined in ids and types[ids[joined]] == NORMAL:
                    score = scores[ids[joined]]
                    if best is None or score > best[0]:
                        best = (score, i)
            if best is None:
                break
            i = best[1]
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        for symbol in symbols:
            if symbol in ids:
                out.append(ids[symbol])
            else:
                out.extend(ids[f"<0x{b:02X}>"] for b in symbol.encode())
    return out


def _split_keep(text: str, token: str) -> list[str]:
    parts = text.split(token)
    out = []
    for i, part in enumerate(parts):
        if i:
            out.append(token)
        if part:
            out.append(part)
    return out


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(metadata(), source="tiny-spm")


def assert_llamacpps_round_trip(tokenizer: Tokenizer, text: str, expected: list[int]) -> list[int]:
    """text encodes to llama.cpp's ids (`expected`) and decodes back to itself; the ids."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert ids == expected
    assert tokenizer.decode(ids) == text
    return ids


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("abc", ["abc"]),  # b+c first (it scores above a+b), then a+bc
        ("ab ab", ["ab", SPACE + "ab"]),
        ("aab", ["aa", "b"]),  # a+a is the best pair of the three
        ("dddd", ["dd", "dd"]),  # the leftmost of equal pairs, then d+d over dd+d
        ("  a", [SPACE, SPACE + "a"]),  # ▁+a scores above ▁+▁
        ("é", ["é"]),
        ("e", ["<0x65>"]),  # not a token: spelled in bytes
        ("ü", ["<0xC3>", "<0xBC>"]),
        ("a\n\nb", ["a", "\n\n", "b"]),  # a user-defined token, matched whole
    ],
)
def test_tiny_vocabulary_pieces(tokenizer: Tokenizer, text: str, pieces: list[str]) -> None:
    ids = assert_llamacpps_round_trip(tokenizer, text, llamacpp_spm(text, metadata()))
    assert [tokenizer.id_to_token(i) for i in ids] == pieces


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcdé ü\n", max_size=24))
def test_the_bpe_is_llamacpps_algorithm(tokenizer: Tokenizer, text: str) -> None:
    assert_llamacpps_round_trip(tokenizer, text, llamacpp_spm(text, metadata()))


def test_a_space_prefix_is_added_and_stripped_again() -> None:
    meta = metadata(add_space_prefix=True)
    tokenizer = Tokenizer.from_gguf_metadata(meta, source="tiny-spm")
    ids = tokenizer.encode("ab ab", add_special_tokens=False)
    assert [tokenizer.id_to_token(i) for i in ids] == [SPACE + "ab", SPACE + "ab"]
    assert ids == llamacpp_spm("ab ab", meta)
    assert tokenizer.decode(ids) == "ab ab"


def test_bos_end_of_turn_and_specials() -> None:
    tokenizer = Tokenizer.from_gguf_metadata(
        metadata(**{"tokenizer.ggml.add_bos_token": True}), source="tiny-spm"
    )
    assert tokenizer.encode("ab")[0] == 1  # the file asks for a BOS
    # Its <end_of_turn> control token ends a sequence, as llama.cpp treats it.
    assert tokenizer.eos_token_ids == (2, 3)
    ids = tokenizer.encode("<s>ab</s>", add_special_tokens=False)
    assert ids[0] == 1 and ids[-1] == 2
    assert tokenizer.decode(ids, skip_special_tokens=True) == "ab"


def test_a_vocabulary_without_byte_tokens_is_refused() -> None:
    meta = metadata()
    for key in ("tokens", "token_type", "scores"):
        values = meta[f"tokenizer.ggml.{key}"]
        meta[f"tokenizer.ggml.{key}"] = values[:5] + values[5 + 256 :]
    with pytest.raises(TokenizerError, match="without byte tokens"):
        Tokenizer.from_gguf_metadata(meta, source="tiny-spm")


def test_scores_of_another_length_are_refused() -> None:
    meta = metadata()
    meta["tokenizer.ggml.scores"] = meta["tokenizer.ggml.scores"][:-1]
    with pytest.raises(TokenizerError, match="disagree"):
        Tokenizer.from_gguf_metadata(meta, source="tiny-spm")


# Gemma 4's form ("gemma4"): the same spelling, merged by the file's own ranks. Ranks that the
# scores above would not give: "ab" before "bc", so "abc" is ab+c, then abc.
GEMMA4_MERGES = [
    "a b", "ab c", f"{SPACE} a", f"{SPACE}a b", "a a", "c d", "d d", "dd d", f"{SPACE} {SPACE}",
]  # fmt: skip


def gemma4_metadata() -> dict[str, Any]:
    meta = metadata()
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    tokens[3:5] = ["<turn|>", "\n"]  # Gemma 4's end of turn; a lone newline is a normal token
    types[4] = NORMAL
    tokens.append("\n\n")
    types.append(NORMAL)
    meta["tokenizer.ggml.scores"].append(0.0)
    return {
        **meta,
        "tokenizer.ggml.model": "gemma4",
        "tokenizer.ggml.merges": [*GEMMA4_MERGES, "\n \n"],
    }


def llamacpp_gemma4(text: str, meta: dict[str, Any]) -> list[int]:
    """llama.cpp's BPE as its `gemma4` pre-type runs it: spaces as ▁, the text split into runs
    of newlines and runs of anything else, in each the lowest-ranked adjacent pair merged (the
    leftmost on a tie) until none is a merge, then bytes for symbols that are no token."""
    tokens = meta["tokenizer.ggml.tokens"]
    ids = {t: i for i, t in reversed(list(enumerate(tokens)))}
    ranks = {tuple(m.split(" ", 1)) if not m.startswith(" ") else (m[0], m[2:]): r
             for r, m in enumerate(meta["tokenizer.ggml.merges"])}  # fmt: skip
    out: list[int] = []
    for run in re.findall(r"[^\n]+|[\n]+", text.replace(" ", SPACE)):
        symbols = list(run)
        while True:
            pairs = [(ranks.get((symbols[i], symbols[i + 1])), i) for i in range(len(symbols) - 1)]
            best = min(((r, i) for r, i in pairs if r is not None), default=None)
            if best is None:
                break
            i = best[1]
            symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]
        for symbol in symbols:
            if symbol in ids:
                out.append(ids[symbol])
            else:
                out.extend(ids[f"<0x{b:02X}>"] for b in symbol.encode())
    return out


@pytest.fixture(scope="module")
def gemma4() -> Tokenizer:
    return Tokenizer.from_gguf_metadata(gemma4_metadata(), source="tiny-gemma4")


@pytest.mark.parametrize(
    ("text", "pieces"),
    [
        ("abc", ["abc"]),  # a+b ranks first here, then ab+c
        ("ab ab", ["ab", SPACE, "ab"]),  # a+b ranks above ▁+a, and ▁+ab is no merge
        ("dddd", ["dd", "dd"]),  # d+d leftmost, then d+d (it ranks above dd+d)
        ("a\n\nb", ["a", "\n\n", "b"]),  # the newline run apart, merged by its own rank
        ("e", ["<0x65>"]),
    ],
)
def test_gemma4_vocabulary_pieces(gemma4: Tokenizer, text: str, pieces: list[str]) -> None:
    ids = assert_llamacpps_round_trip(gemma4, text, llamacpp_gemma4(text, gemma4_metadata()))
    assert [gemma4.id_to_token(i) for i in ids] == pieces


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="abcdé ü\n", max_size=24))
def test_gemma4_is_llamacpps_bpe(gemma4: Tokenizer, text: str) -> None:
    assert_llamacpps_round_trip(gemma4, text, llamacpp_gemma4(text, gemma4_metadata()))


def test_gemma4_begins_with_bos_and_ends_turns() -> None:
    # the file says no BOS; llama.cpp adds one to every Gemma 4 sequence all the same
    tokenizer = Tokenizer.from_gguf_metadata(gemma4_metadata(), source="tiny-gemma4")
    assert tokenizer.encode("ab") == [1, tokenizer.token_to_id("ab")]
    assert tokenizer.eos_token_ids == (2, 3)  # </s>, and <turn|>


def test_gemma4_without_merges_is_refused() -> None:
    meta = gemma4_metadata()
    del meta["tokenizer.ggml.merges"]
    with pytest.raises(TokenizerError, match=r"without tokenizer\.ggml\.merges"):
        Tokenizer.from_gguf_metadata(meta, source="tiny-gemma4")
