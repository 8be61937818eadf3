"""Batch invariance on torch's path: a row's result independent of the rows beside it.

The forward's linears on a CPU run on row tiles of one fixed size, and its attention matmuls in
float64 where invariance is asked for; `invariance` says, per backend, what a row's tokens are
independent of. nanoserve's own kernels need none of this: each number they compute has one
order of operations by construction.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# MKL's fp32 GEMM picks its kernel by the number of rows, and which counts share a kernel
# differs per CPU (Zen 3/4: 1, 2-3, multiples of 4; an Intel AMX Xeon: 1, 2-15, 16 and up);
# oneDNN's bf16 GEMM on that Xeon changes kernel past 32 rows. At one fixed count a row's
# result ignores the other rows and its position among them on every CPU measured, so the
# batch-invariant torch path calls its GEMMs on tiles of exactly one size: 4 rows in float32
# (the cheapest for decode), 32 in bf16 (decode as fast as untiled, prefill faster than 4-row
# tiles).
INVARIANT_ROW_TILE = {torch.float32: 4}
BF16_ROW_TILE = 32


def attention_dtype(
    dtype: torch.dtype, batch_invariant: bool, device: torch.device | str = "cpu"
) -> torch.dtype:
    """What torch's attention matmuls run in. On a CPU with invariance asked for: float64,
    whatever the model's dtype (padding width and kernel shape then leave no trace once rounded
    back; bf16's own oneDNN kernels were invariant on a Zen 4 but not on an Intel AMX Xeon).
    Otherwise the model's dtype (float32 for fp32). On CUDA always the model's dtype: float64
    and row tiles are recipes measured against MKL and oneDNN, not cuBLAS, and float64 is slow
    there; see `invariance`. (nanoserve's CPU kernels accumulate in float32 in one fixed order,
    and need neither.)"""
    cpu = torch.device(device).type == "cpu"
    return torch.float64 if batch_invariant and cpu else dtype


def invariance(
    dtype: torch.dtype, batch_invariant: bool, device: torch.device | str, kernels: str = "torch"
) -> str:
    """What a row's tokens are independent of, per backend, as measured or as built:

    - "batch, bucket and ISA" (nanoserve's CPU kernels): alone, batched, padded to any bucket,
      on any x86 CPU — each number has one order of operations, by construction;
    - "batch and bucket" (torch on a CPU, batch_invariant): alone, batched, padded to any
      bucket, on this CPU class (see the README's per-ISA table);
    - "bucket shape" (CUDA, or batch_invariant off): the same bucket shape gives the same
      bits (recorded == eager at that shape); across shapes the BLAS may pick other kernels."""
    if kernels == "nanoserve":
        return "batch, bucket and ISA"
    cpu = torch.device(device).type == "cpu"
    return "batch and bucket" if batch_invariant and cpu else "bucket shape"


def tiled_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """F.linear on row tiles of exactly one size for x's dtype (the last one zero-padded)."""
    rows, tile = x.shape[0], INVARIANT_ROW_TILE.get(x.dtype, BF16_ROW_TILE)
    pad = -rows % tile
    if pad:
        x = torch.cat((x, x.new_zeros(pad, x.shape[1])))
    if rows + pad == tile:
        return F.linear(x, w, b)[:rows]
    return torch.cat([F.linear(part, w, b) for part in x.split(tile)])[:rows]
