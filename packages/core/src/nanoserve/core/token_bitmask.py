"""Token bitmasks: which tokens a grammar allows, 32 tokens to an int32 word, and applying them.

The layout is the one llguidance and xgrammar write: row r, token t is bit `t % 32` of word
`t // 32`; a set bit allows the token. A vocabulary of 49,152 tokens packs into 1,536 words
(6 KiB per row), so the mask crosses to the device as bits and is unpacked there.
"""

from __future__ import annotations

import torch

BITS_PER_WORD = 32


def bitmask_words(vocab_size: int) -> int:
    """Words per row of a bitmask over `vocab_size` tokens."""
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bitmask: [rows, words] int32 -> [rows, vocab_size] bool, True where the token is allowed."""
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask[:, :, None] >> shifts) & 1  # [rows, words, 32]
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, rows: torch.Tensor) -> None:
    """In place: logits[rows[i], t] = -inf wherever bitmask[i] forbids token t.

    logits: [batch, vocab] float; bitmask: [k, words] int32; rows: [k] int64, distinct. Rows not
    named are untouched, bit for bit (an unconstrained row of a mixed batch samples as alone).
    A token past the mask's last word is forbidden."""
    vocab = logits.shape[1]
    allowed = unpack_bitmask(bitmask, min(vocab, bitmask.shape[1] * BITS_PER_WORD))
    if allowed.shape[1] < vocab:  # the model's embedding has rows the tokenizer never produces
        pad = torch.zeros(
            (allowed.shape[0], vocab - allowed.shape[1]), dtype=torch.bool, device=allowed.device
        )
        allowed = torch.cat([allowed, pad], dim=1)
    picked = logits.index_select(0, rows).masked_fill_(~allowed, float("-inf"))  # [k, vocab]
    logits.index_copy_(0, rows, picked)
