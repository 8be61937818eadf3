"""GgufBlocks: a GGUF tensor as the file stores it, for the code that reads it so.

A loader hands a tensor over as its blocks, instead of dequantized floats, when the weight form
reads that type as stored: the rows are a view of the file's memory map (no copy), and
llama.cpp's own weights reach nanoserve's kernels bit for bit, with no float round trip. One row
per output feature; `order` gives the rows in Hugging Face order where llama.cpp permuted them
(Llama's Q and K), so the packer reads them in place rather than a permuted copy.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from nanoserve.runtime.loading.gguf_types import BY_NAME, GgmlType


@dataclass(frozen=True, slots=True)
class GgufBlocks:
    kind: str  # GGML's name: "Q4_K", "Q8_0", "F16", ...
    rows: torch.Tensor  # [out, bytes per row] uint8, as stored (file order)
    shape: tuple[int, int]  # [out, in], the tensor's logical (Hugging Face) shape
    order: torch.Tensor | None = None  # [out] int64: HF row f is rows[order[f]]; None: the same
    # Drops the rows' pages from the process once a packer has copied them (the file map's).
    release: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def done(self) -> None:
        """The reader has what it needs of these bytes (a packed copy)."""
        if self.release is not None:
            self.release()

    @property
    def ggml(self) -> GgmlType:
        return BY_NAME[self.kind]

    def hf_rows(self) -> torch.Tensor:
        """The rows in Hugging Face order (a copy where they were permuted)."""
        return self.rows if self.order is None else self.rows.index_select(0, self.order)
