"""Token bitmasks: the bit layout, and masking only the rows named, bit for bit."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.core.token_bitmask import apply_token_bitmask, bitmask_words, unpack_bitmask


def pack(allowed: list[list[bool]]) -> torch.Tensor:
    """The reference packing: token t is bit t % 32 of word t // 32."""
    words = bitmask_words(len(allowed[0]))
    out = torch.zeros((len(allowed), words), dtype=torch.int64)
    for r, row in enumerate(allowed):
        for t, ok in enumerate(row):
            if ok:
                out[r, t // 32] |= 1 << (t % 32)
    # int32 words, as llguidance writes them (bit 31 set reads as a negative number)
    return torch.where(out >= 2**31, out - 2**32, out).to(torch.int32)


def test_words_round_up() -> None:
    assert [bitmask_words(v) for v in (1, 32, 33, 64, 49152)] == [1, 1, 2, 2, 1536]


def test_unpack_reads_bit_t_mod_32_of_word_t_div_32() -> None:
    mask = torch.tensor([[0b101, -(2**31)]], dtype=torch.int32)  # tokens 0, 2 and 63
    allowed = unpack_bitmask(mask, 64)
    assert allowed.nonzero()[:, 1].tolist() == [0, 2, 63]


def test_apply_masks_named_rows_only() -> None:
    logits = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    before = logits.clone()
    mask = pack([[True, False, False, True]])
    apply_token_bitmask(logits, mask, torch.tensor([1]))
    inf = float("-inf")
    assert logits[1].tolist() == [4.0, inf, inf, 7.0]
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])


def test_tokens_past_the_mask_are_forbidden() -> None:
    logits = torch.zeros((1, 40))
    apply_token_bitmask(logits, torch.tensor([[-1]], dtype=torch.int32), torch.tensor([0]))
    assert torch.isinf(logits[0, 32:]).all() and not torch.isinf(logits[0, :32]).any()


@settings(max_examples=50, deadline=None)
@given(
    vocab=st.integers(1, 100),
    rows=st.integers(1, 4),
    data=st.data(),
)
def test_apply_agrees_with_the_reference(vocab: int, rows: int, data: st.DataObject) -> None:
    allowed = [
        data.draw(st.lists(st.booleans(), min_size=vocab, max_size=vocab)) for _ in range(rows)
    ]
    picked = data.draw(st.lists(st.integers(0, rows - 1), unique=True, min_size=1))
    logits = torch.randn((rows, vocab), generator=torch.Generator().manual_seed(vocab))
    expected = logits.clone()
    for i, r in enumerate(picked):
        for t in range(vocab):
            if not allowed[i % rows][t]:
                expected[r, t] = float("-inf")
    mask = pack([allowed[i % rows] for i in range(len(picked))])
    apply_token_bitmask(logits, mask, torch.tensor(picked))
    assert torch.equal(logits, expected)
