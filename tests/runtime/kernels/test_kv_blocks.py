"""The K/V pool in GGUF blocks (kernels/csrc/kv_blocks.h): written as ggml's reference
quantizers round, read as the `gguf` package dequantizes, and attended over on every ISA path
this CPU runs, with the same bits on each."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from nanoserve.core.kv_cache_dtype import KvCacheDtype, dequantize_row, form_bytes
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


def pool(kv_dtype: KvCacheDtype, slots: int) -> torch.Tensor:
    return torch.zeros(slots + 1, KV_HEADS, kv_dtype.row_bytes(DIM), dtype=torch.uint8)


def write(kv_dtype: KvCacheDtype, values: torch.Tensor) -> torch.Tensor:
    """K and V rows ([tokens, 2 * KV_HEADS * DIM]) written through the kernel, unrotated."""
    tokens = values.shape[0]
    qkv = torch.cat((torch.zeros(tokens, HEADS * DIM), values), dim=1)
    kv = pool(kv_dtype, tokens)
    ops.rope_write_kv(qkv, torch.zeros(tokens, dtype=torch.int64), torch.ones(1, DIM),
                      torch.zeros(1, DIM), kv, torch.arange(tokens), HEADS,
                      list(kv_dtype.kernel_types))  # fmt: skip
    return kv


@pytest.mark.parametrize(("k", "v"), PAIRS)
def test_the_write_rounds_as_ggml_and_the_read_as_gguf(
    runnable_isas: list[str], k: str, v: str
) -> None:
    """Bytes equal to the `gguf` package's quantize_blocks on every ISA; values read back equal
    to its dequantize_blocks."""
    kv_dtype = KvCacheDtype(k, v)
    tokens = 24
    values = awkward_values(torch.Generator().manual_seed(3), tokens * 2 * KV_HEADS * DIM)
    values = values.view(tokens, 2 * KV_HEADS * DIM)
    results = on_every_isa(runnable_isas, lambda: write(kv_dtype, values))
    assert_same_bits(results)
    stored = results["portable"][:tokens]  # [tokens, heads, K bytes + V bytes]
    k_bytes = form_bytes(k, DIM)
    for form, part, rows in (
        (k, stored[..., :k_bytes], values[:, : KV_HEADS * DIM]),
        (v, stored[..., k_bytes:], values[:, KV_HEADS * DIM :]),
    ):
        want = gguf.quants.quantize(rows.reshape(-1, DIM).numpy(), GGML[form])
        assert np.array_equal(part.reshape(-1, want.shape[-1]).numpy(), want), form
        back = gguf.quants.dequantize(want, GGML[form])
        got = dequantize_row(part, form, DIM).reshape(-1, DIM)
        assert np.array_equal(got.numpy(), back), form


def dequantized(kv: torch.Tensor, kv_dtype: KvCacheDtype) -> torch.Tensor:
    """The block pool as floats, [2, slots + 1, kv_heads, dim]."""
    k_bytes = form_bytes(kv_dtype.k, DIM)
    return torch.stack(
        (
            dequantize_row(kv[..., :k_bytes], kv_dtype.k, DIM),
            dequantize_row(kv[..., k_bytes:], kv_dtype.v, DIM),
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
    within 2e-6 of float64 attention over the dequantized slots."""
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
