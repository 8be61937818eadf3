"""TokenMasks: one step's allowed-token bitmasks for the constrained rows, filled in one call.

The buffer is allocated once ([max_rows, words] int32, pinned where CUDA is) and llguidance
writes every constrained row's mask into it in parallel, from its own threads; the sampler
applies the rows it is given and leaves the others untouched.
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
        self._executor: llguidance.LLExecutor | None = None  # made by the first fill

    def fill(self, rows: Sequence[tuple[int, llguidance.LLMatcher]]) -> StepMask | None:
        """rows: (sampled-row index, its matcher), in row order; None when there are none."""
        if not rows:
            return None
        if len(rows) > self._buffer.shape[0]:  # more rows than planned for: grow once
            self._buffer = torch.empty((len(rows), self.words), dtype=torch.int32)
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        out = self._buffer[: len(rows)]  # [rows, words], contiguous: a prefix of the buffer
        # What llguidance.torch.fill_next_token_bitmask_par does; that module is not imported
        # because it torch.compile-decorates a function at import (loading all of inductor).
        self._executor.unsafe_compute_mask_ptr(
            [(m, i) for i, (_, m) in enumerate(rows)], out.data_ptr(), self.words * 4, len(rows)
        )
        return StepMask(tuple(r for r, _ in rows), out)
