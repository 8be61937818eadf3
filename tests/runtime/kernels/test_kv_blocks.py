"""The K/V pool in GGUF blocks (kernels/csrc/kv_blocks.h): each row turned through llama.cpp's
Hadamard matrices (core/kv_rotation.py), written as ggml's reference quantizers round, read as
the `gguf` package dequantizes, and attended over on every ISA path this CPU runs, with the same
bits on each."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from nanoserve.core.kv_cache_dtype import KvCacheDtype, dequantize_row, form_bytes
from nanoserve.core.kv_rotation import hadamard, rotation_width
from tests.runtime.isa_paths import assert_same_bits, on_every_isa

ops = torch.ops.nanoserve
GGML = {"q8_0": gguf.GGMLQuantizationType.Q8_0, "q4_0": gguf.GGMLQuantizationType.Q4_0}
PAIRS = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"), ("q4_0", "q8_0")]
HEADS, KV_HEADS, DIM = 4, 2, 64


def awkward_values(g: torch.Generator, n: int) -> torch.Tensor:
    """Random rows at many scales, with ties for the roundings, zeros and one-sign blocks."""
    x = torch.randn(n, generator=g) * torch.logspace(-6, 3, n)[torch.randperm(n, generator=g)]
    x[:32] = 0.0  # an all-zero block: d = 0
    x[32:64] = torch.arange(32) - 15.5  # q8_0 scale 16.5/127: many products near .5
    x[64:96] = torch.arange(32) / 2  # q4_0: the largest magnitude is positive
    x[96:128] = -x[64:96]
    x[128:160] = torch.tensor([4.0, -4.0] * 16)  # two of the largest magnitude: the first wins
    return x


def pool(kv_dtype: KvCacheDtype, slots: int, dim: int = DIM) -> torch.Tensor:
    return torch.zeros(slots + 1, KV_HEADS, kv_dtype.row_bytes(dim), dtype=torch.uint8)


def write(kv_dtype: KvCacheDtype, values: torch.Tensor, dim: int = DIM) -> torch.Tensor:
    """K and V rows ([tokens, 2 * KV_HEADS * dim]) written through the kernel, no rotary."""
    tokens = values.shape[0]
    qkv = torch.cat((torch.zeros(tokens, HEADS * dim), values), dim=1)
    kv = pool(kv_dtype, tokens, dim)
    ops.rope_write_kv(qkv, torch.zeros(tokens, dtype=torch.int64), torch.ones(1, dim),
                      torch.zeros(1, dim), kv, torch.arange(tokens), HEADS,
                      list(kv_dtype.kernel_types))  # fmt: skip
    return kv


@pytest.mark.parametrize(
    ("k", "v", "dim"), [*((k, v, DIM) for k, v in PAIRS), ("q8_0", "q4_0", 128)]
)
def test_the_write_turns_rounds_as_ggml_and_reads_as_gguf(
    runnable_isas: list[str], k: str, v: str, dim: int
) -> None:
    """Bytes equal to the `gguf` package's quantize_blocks of each row turned (K by the largest
    power of two dividing head_dim, V by 64), on every ISA; values read back equal to its
    dequantize_blocks."""
    kv_dtype = KvCacheDtype(k, v)
    tokens = 24
    values = awkward_values(torch.Generator().manual_seed(3), tokens * 2 * KV_HEADS * dim)
    values = values.view(tokens, 2 * KV_HEADS * dim)
    results = on_every_isa(runnable_isas, lambda: write(kv_dtype, values, dim))
    assert_same_bits(results)
    stored = results["portable"][:tokens]  # [tokens, heads, K bytes + V bytes]
    k_bytes = form_bytes(k, dim)
    assert (rotation_width(k, dim, v=False), rotation_width(v, dim, v=True)) == (dim, 64)
    for form, part, rows, is_v in (
        (k, stored[..., :k_bytes], values[:, : KV_HEADS * dim], False),
        (v, stored[..., k_bytes:], values[:, KV_HEADS * dim :], True),
    ):
        turned = hadamard(rows.reshape(-1, dim), rotation_width(form, dim, v=is_v))
        want = gguf.quants.quantize(turned.numpy(), GGML[form])
        assert np.array_equal(part.reshape(-1, want.shape[-1]).numpy(), want), form
        back = gguf.quants.dequantize(want, GGML[form])
        got = dequantize_row(part, form, dim).reshape(-1, dim)
        assert np.array_equal(got.numpy(), back), form


def dequantized(kv: torch.Tensor, kv_dtype: KvCacheDtype) -> torch.Tensor:
    """The block pool as floats, turned back, [2, slots + 1, kv_heads, dim]."""
    k_bytes = form_bytes(kv_dtype.k, DIM)
    k = dequantize_row(kv[..., :k_bytes], kv_dtype.k, DIM)
    v = dequantize_row(kv[..., k_bytes:], kv_dtype.v, DIM)
    return torch.stack(
        (
            hadamard(k, rotation_width(kv_dtype.k, DIM, v=False)),
            hadamard(v, rotation_width(kv_dtype.v, DIM, v=True)),
        )
    )


def reference(
    q: torch.Tensor, floats: torch.Tensor, rect: torch.Tensor, lens: torch.Tensor, window: int
) -> torch.Tensor:
    """float64 attention over the dequantized slots, grouped heads, scale 0.2."""
    out = torch.zeros(q.shape[0], HEADS * DIM, dtype=torch.float64)
    group = HEADS // KV_HEADS
    for t in range(q.shape[0]):
        n = int(lens[t])
        lo = max(0, n - window) if window else 0
        slots = rect[t, lo:n]
        if not len(slots):
            continue
        k, v = floats[0, slots].double(), floats[1, slots].double()
        for h in range(HEADS):
            qh = q[t, h * DIM : (h + 1) * DIM].double()
            weights = torch.softmax((k[:, h // group] @ qh) * 0.2, dim=0)
            out[t, h * DIM : (h + 1) * DIM] = weights @ v[:, h // group]
    return out


@pytest.mark.parametrize(("k", "v"), PAIRS)
@pytest.mark.parametrize("window", [0, 5])
def test_attention_reads_the_blocks_in_place(
    runnable_isas: list[str], k: str, v: str, window: int
) -> None:
    """Decode rows and prompt rows (rect_rows) over a block pool: the same bits on every ISA,
    within 2e-6 of float64 attention over the dequantized slots turned back."""
    kv_dtype = KvCacheDtype(k, v)
    g = torch.Generator().manual_seed(5)
    kv = write(kv_dtype, torch.randn(40, 2 * KV_HEADS * DIM, generator=g))
    kv = torch.cat((kv[:40], torch.full_like(kv[:1], 255)))  # the sink: nothing may read it
    rect = torch.randperm(40, generator=g)[:36].reshape(2, 18)
    q = torch.randn(4, HEADS * DIM, generator=g)
    lens, rows = torch.tensor([18, 0, 7, 1]), torch.tensor([0, 1, 1, 1])
    codes = list(kv_dtype.kernel_types)
    results = on_every_isa(
        runnable_isas,
        lambda: ops.paged_attention(q, kv, rect, rows, lens, 0.2, HEADS, window, codes),
    )
    assert_same_bits(results)
    got = results["portable"]
    want = reference(q, dequantized(kv, kv_dtype), rect[rows], lens, window)
    assert torch.allclose(got.double(), want, rtol=0, atol=2e-6), (got.double() - want).abs().max()


def test_a_block_pool_of_the_wrong_shape_is_refused() -> None:
    kv = torch.zeros(5, KV_HEADS, 100, dtype=torch.uint8)  # not whole q8_0 + q8_0 blocks
    q = torch.zeros(1, HEADS * DIM)
    with pytest.raises(RuntimeError, match="whole blocks"):
        ops.paged_attention(q, kv, torch.zeros(1, 1, dtype=torch.int64), None,
                            torch.tensor([1]), 0.2, HEADS, 0, [3, 3])  # fmt: skip
    with pytest.raises(RuntimeError, match="q8_0 \\(3\\) or q4_0 \\(4\\)"):
        ops.paged_attention(q, pool(KvCacheDtype("q8_0", "q8_0"), 4),
                            torch.zeros(1, 1, dtype=torch.int64), None, torch.tensor([1]), 0.2,
                            HEADS, 0, [3, 2])  # fmt: skip
