"""GgufBlocks: a quantized GGUF tensor as the file stores it, for the kernels that read it so.

A loader asks for the block types it can serve as stored (`keep_blocks`); those tensors arrive
as their raw rows of blocks instead of dequantized floats, so llama.cpp's own 4- and 8-bit
weights reach nanoserve's kernels exactly, with no float round trip. One row per output
feature (Hugging Face layout: Q and K rows already unpermuted), each row its blocks in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# The GGUF types whose blocks nanoserve's kernels take as they are (see model/quant_weight.py).
BLOCK_TYPES = frozenset({"Q4_0", "Q4_1", "Q8_0"})


@dataclass(frozen=True, slots=True)
class GgufBlocks:
    kind: str  # "Q4_0", "Q4_1" or "Q8_0"
    data: torch.Tensor  # [out, bytes per row] uint8
    shape: tuple[int, int]  # [out, in], the tensor's logical (Hugging Face) shape
