"""GGML's type table: the loader's, the kernels' and the `gguf` package's agree."""

from __future__ import annotations

import gguf
import torch

from nanoserve.runtime.kernels.cpu_kernels import load_cpu_kernels
from nanoserve.runtime.loading.gguf_types import (
    DEQUANTIZED_HERE,
    GGML_TYPES,
    KERNEL_TYPES,
    block_geometry,
)


def test_block_geometry_is_gguf_packages() -> None:
    for number, t in GGML_TYPES.items():
        qtype = gguf.GGMLQuantizationType(number)
        assert qtype.name == t.name
        assert gguf.GGML_QUANT_SIZES[qtype] == (t.block, t.block_bytes), t.name
    assert block_geometry(12) == (256, 144) and block_geometry(99) is None


def test_the_kernels_table_agrees() -> None:
    load_cpu_kernels()
    for kind in DEQUANTIZED_HERE:
        t = next(t for t in GGML_TYPES.values() if t.name == kind)
        name, inputs, file_bytes, packed_bytes, linear = torch.ops.nanoserve.weight_type_info(
            t.number
        )
        assert (name, inputs, file_bytes) == (t.label, t.block, t.block_bytes)
        assert linear == (kind in KERNEL_TYPES)
        assert (packed_bytes > 0) == linear
    assert GGML_TYPES[12].row_bytes(512) == 288 and GGML_TYPES[12].label == "q4_k"
