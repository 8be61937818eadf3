"""TokenMasks: one step's allowed-token bitmasks for the constrained rows.

The buffer is allocated once ([max_rows, words] int32, pinned where CUDA is). llguidance writes
each constrained row's mask straight into its row, with the GIL dropped, one row after another
on the calling thread: its parallel executor was measured slower here, its worker threads
spinning against the forward's on a 2-core machine (35% of tok/s at 8 streams, against 20%).
The sampler applies the rows it is given and leaves the others untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nanoserve.core.token_bitmask import bitmask_words

if TYPE_CHECKING:
    import llguidance


@dataclass(frozen=True, slots=True)
class StepMask:
    """rows: indices into the step's sampled rows; bitmask: [len(rows), words] int32, host."""

    rows: tuple[int, ...]
    bitmask: torch.Tensor


class TokenMasks:
    def __init__(self, vocab_size: int, max_rows: int, *, pin: bool = False) -> None:
        self.vocab_size = vocab_size
        self.words = bitmask_words(vocab_size)
        self._buffer = torch.empty((max_rows, self.words), dtype=torch.int32, pin_memory=pin)

    def fill(self, rows: Sequence[tuple[int, llguidance.LLMatcher]]) -> StepMask | None:
        """rows: (sampled-row index, its matcher), in row order; None when there are none."""
        if not rows:
            return None
        if len(rows) > self._buffer.shape[0]:  # more rows than planned for: grow once
            self._buffer = torch.empty((len(rows), self.words), dtype=torch.int32)
        out = self._buffer[: len(rows)]  # [rows, words]
        row_bytes = self.words * 4
        base = out.data_ptr()
        for i, (_, matcher) in enumerate(rows):
            matcher.unsafe_compute_mask_ptr(base + i * row_bytes, row_bytes)
        return StepMask(tuple(r for r, _ in rows), out)
