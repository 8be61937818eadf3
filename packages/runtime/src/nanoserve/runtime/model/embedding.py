"""QuantEmbedding: a GGUF embedding table read from its own rows, one looked-up row at a time.

The table is the largest tensor of a small model (Qwen2.5-0.5B: 151,936 x 896, 93 MB as Q5_0,
272 MB as bf16) and a step reads a handful of its rows. So it stays where the file keeps it, a
view of the memory map, and each lookup dequantizes only its rows (exactly the file's values,
in float32): no float copy of the table exists, and only rows ever looked up are resident. A
tied output projection is packed from the same rows (weight_forms.quant_weight).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoserve.runtime.kernels import kernel_ops
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks


@dataclass(frozen=True, slots=True)
class QuantEmbedding:
    blocks: GgufBlocks  # [vocab, bytes per row] of one GGUF type, as stored

    @property
    def kind(self) -> str:
        return self.blocks.kind

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self.blocks.shape)

    def __getitem__(self, ids: torch.Tensor) -> torch.Tensor:
        """[len(ids), hidden] float32: the rows of these token ids."""
        b = self.blocks
        return kernel_ops.dequantize_rows(b.rows, b.ggml.number, b.shape[1], ids)
