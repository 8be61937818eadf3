"""The Hadamard turn a K/V pool of blocks keeps its rows in, as llama.cpp's quantized caches do.

A few channels of a K (or V) head often carry values far larger than the rest; a 32-value block
whose scale follows such an outlier rounds its other values coarsely. Turning each row through
an orthonormal Hadamard matrix H first spreads an outlier over the whole chunk, and costs no
accuracy otherwise: H is its own inverse, and q . k = (H q) . (H k). So a pool of blocks stores
H k and H v; attention turns each query through K's matrix and each output back through V's.

The widths are llama.cpp's (its `attn_rot_k` / `attn_rot_v`, on by default for a quantized cache
since 2026): K turns by the largest power of two dividing head_dim, V by 64, each chunk of that
width on its own; a float form, or a head_dim that is not a multiple of 64, is not turned.

kernels/csrc/kv_blocks.h (`hadamard`) and kernel_table.h (`kv_rotation_width`) are the kernels'
side; `hadamard` here does the same adds in the same order, for checks.
"""

from __future__ import annotations

import torch

from nanoserve.core.kv_cache_dtype import BLOCK_BYTES

SMALLEST = 64  # llama.cpp's width for V, and the least for K


def rotation_width(form: str, head_dim: int, *, v: bool) -> int:
    """The width of the turn a K (v False) or V row of head_dim values kept as `form` is stored
    through; 0 for none."""
    if form not in BLOCK_BYTES or head_dim % SMALLEST:
        return 0
    width = SMALLEST
    while not v and head_dim % (2 * width) == 0:
        width *= 2
    return width


def hadamard(x: torch.Tensor, width: int) -> torch.Tensor:
    """x (float32, last dim a multiple of width) with each `width`-value chunk of its last dim
    turned through H (Sylvester's, natural order, H[i][j] = (-1)^popcount(i & j), times
    1 / sqrt(width)): a fast Walsh-Hadamard transform's butterflies, then the scale, rounded
    exactly as the kernels round them. Its own inverse, up to rounding."""
    shape = x.shape
    y = x.reshape(-1, width)
    stride = 1
    while stride < width:
        pairs = y.reshape(-1, width // (2 * stride), 2, stride)
        a, b = pairs[:, :, 0], pairs[:, :, 1]
        y = torch.stack((a + b, a - b), dim=2).reshape(-1, width)
        stride *= 2
    scale = torch.tensor(float(width), dtype=torch.float32).sqrt().reciprocal()
    return (y * scale).reshape(shape)
