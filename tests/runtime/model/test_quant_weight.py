"""Packed GGUF weights: every block type read as stored, its dot kernel against gguf's own
dequantization and a float64 matmul (to a stated bound), llama.cpp's rounding for floats, and
the kernels' products exact where the arithmetic is."""

from __future__ import annotations

import struct
from collections.abc import Callable

import gguf
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.runtime.errors import QuantizationError
from nanoserve.runtime.loading.gguf_blocks import GgufBlocks
from nanoserve.runtime.loading.gguf_types import BY_NAME, KERNEL_TYPES
from nanoserve.runtime.model.quant_weight import (
    QuantLinear,
    QuantWeight,
    dequantize_blocks,
    quantize_q4_1,
    quantize_q8_0,
)
from tests.runtime.isa_paths import assert_same_bits, on_every_isa

TYPES = sorted(KERNEL_TYPES, key=lambda k: BY_NAME[k].number)
RandomBlocks = Callable[..., np.ndarray]


def blocks_of(kind: str, rows: np.ndarray, width: int) -> GgufBlocks:
    return GgufBlocks(kind, torch.from_numpy(rows), (rows.shape[0], width))


def gguf_values(kind: str, rows: np.ndarray, width: int) -> torch.Tensor:
    """The reference: the `gguf` package's dequantization of the same bytes."""
    values = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType[kind])
    return torch.from_numpy(np.ascontiguousarray(values, np.float32)).reshape(rows.shape[0], width)


def kernel_activations(x: torch.Tensor) -> torch.Tensor:
    """x as the kernels quantize it: per 32 inputs, scale = amax / 127 and q = round-half-even
    (x / scale), in float32; returned as q * scale."""
    groups = x.reshape(x.shape[0], -1, 32)
    scale = groups.abs().amax(-1, keepdim=True) / 127
    inv = torch.where(scale == 0, torch.zeros_like(scale), 1 / scale)
    return (torch.round(groups * inv) * scale).reshape(x.shape)


def check_against_float64(out: torch.Tensor, w: torch.Tensor, x: torch.Tensor) -> None:
    """The bound: with the activations as the kernel rounds them, the only error left is float32
    accumulation, one rounding per group and per scale product: |err| <= 4 (groups + 2) 2^-24
    sum |w||x|. A weight read one level wrong would miss by d_w d_x, about 2^-7 of a term."""
    xq = kernel_activations(x).double()
    exact = xq @ w.double().T
    magnitude = xq.abs() @ w.double().abs().T
    groups = x.shape[1] // 32
    bound = 4 * (groups + 2) * 2.0**-24 * magnitude + 1e-30
    assert ((out.double() - exact).abs() <= bound).all(), (out.double() - exact).abs().max()
    # and against the unrounded activations: the int8 rounding of x, at most half a step a value
    loose = (x.double() - xq).abs() @ w.double().abs().T + bound
    assert ((out.double() - x.double() @ w.double().T).abs() <= loose).all()


@pytest.mark.parametrize("kind", TYPES)
def test_blocks_dequantize_as_gguf_does(kind: str, random_blocks: RandomBlocks) -> None:
    width = BY_NAME[kind].block * 2
    rows = random_blocks(kind, 19, width, seed=1)
    assert torch.equal(
        dequantize_blocks(blocks_of(kind, rows, width)), gguf_values(kind, rows, width)
    )


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16"])
def test_float_rows_dequantize_as_stored(kind: str, random_blocks: RandomBlocks) -> None:
    rows = random_blocks(kind, 5, 64, seed=2)
    assert torch.equal(dequantize_blocks(blocks_of(kind, rows, 64)), gguf_values(kind, rows, 64))


@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("num_rows", [1, 3, 8, 13])
def test_dot_kernel_is_the_float64_product_of_gguf_values(
    kind: str, num_rows: int, random_blocks: RandomBlocks
) -> None:
    width = 512  # two K blocks, sixteen 32-input groups
    rows = random_blocks(kind, 40, width, seed=num_rows)  # 40: a feature block and a tail
    weight = QuantWeight.pack(blocks_of(kind, rows, width))
    x = torch.randn(num_rows, width, generator=torch.Generator().manual_seed(3)) * 3
    bias = torch.randn(40, generator=torch.Generator().manual_seed(4))
    linear = QuantLinear((weight,))
    w = gguf_values(kind, rows, width)
    check_against_float64(linear.matmul(x), w, x)
    assert torch.equal(linear.matmul(x, bias), linear.matmul(x) + bias)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(2, 24), pick=st.integers(0, 23), kind=st.sampled_from(TYPES))
def test_a_row_ignores_its_batch(
    rows: int, pick: int, kind: str, random_blocks: RandomBlocks
) -> None:
    """Each output number has one order of operations: a row alone, or at any place in any
    batch, gives the same bits (tiles of 8 rows, tails of 1-7)."""
    raw = random_blocks(kind, 24, 256, seed=rows * 31 + pick)
    linear = QuantLinear((QuantWeight.pack(blocks_of(kind, raw, 256)),))
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows))
    pick %= rows
    assert torch.equal(linear.matmul(x)[pick], linear.matmul(x[pick : pick + 1])[0])


def test_parts_of_mixed_types_equal_separate_linears(random_blocks: RandomBlocks) -> None:
    """q (Q5_0), k (Q4_K) and v (Q8_0) in one linear: the same bits as three, side by side,
    and one bias over all of them."""
    width = 256
    parts = [
        QuantWeight.pack(blocks_of(kind, random_blocks(kind, n, width, seed=n), width))
        for kind, n in (("Q5_0", 48), ("Q4_K", 20), ("Q8_0", 16))
    ]
    x = torch.randn(5, width, generator=torch.Generator().manual_seed(5))
    bias = torch.randn(84, generator=torch.Generator().manual_seed(6))
    joined = QuantLinear(tuple(parts))
    assert joined.shape == (84, width) and joined.kinds == ("Q5_0", "Q4_K", "Q8_0")
    alone = torch.cat([QuantLinear((p,)).matmul(x) for p in parts], dim=1)
    assert torch.equal(joined.matmul(x), alone)
    assert torch.equal(joined.matmul(x, bias), alone + bias)


def test_a_row_order_is_applied_while_packing(random_blocks: RandomBlocks) -> None:
    rows = random_blocks("Q6_K", 32, 256, seed=7)
    order = torch.randperm(32, generator=torch.Generator().manual_seed(8))
    blocks = GgufBlocks("Q6_K", torch.from_numpy(rows), (32, 256), order)
    permuted = blocks_of("Q6_K", rows[order.numpy()], 256)
    assert torch.equal(dequantize_blocks(blocks), dequantize_blocks(permuted))
    x = torch.randn(3, 256)
    assert torch.equal(
        QuantLinear((QuantWeight.pack(blocks),)).matmul(x),
        QuantLinear((QuantWeight.pack(permuted),)).matmul(x),
    )


# -- floats in llama.cpp's rounding ----------------------------------------------------------


@pytest.mark.parametrize(("quantize", "kind"), [(quantize_q4_1, "Q4_1"), (quantize_q8_0, "Q8_0")])
def test_floats_quantize_to_gguf_bytes(quantize: Callable[..., GgufBlocks], kind: str) -> None:
    w = torch.randn(24, 96, generator=torch.Generator().manual_seed(9))
    blocks = quantize(w)
    expected = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType[kind])
    assert blocks.kind == kind and blocks.shape == (24, 96)
    assert np.array_equal(blocks.rows.numpy(), expected)


def test_q4_1_is_llamacpp_rounding() -> None:
    # (x - min) / d + 0.5, truncated: 0.5 rounds up, 0.49 down (llama.cpp, not half-to-even).
    row = torch.tensor([0.0, 15.0, 0.5, 0.49, 2.5, 3.5] + [0.0] * 26)
    values = dequantize_blocks(quantize_q4_1(row[None]))
    assert values[0, :6].tolist() == [0.0, 15.0, 1.0, 0.0, 3.0, 4.0]
    constant = dequantize_blocks(quantize_q4_1(torch.full((1, 32), 3.0)))
    assert torch.equal(constant, torch.full((1, 32), 3.0))  # d = 0, m = 3


def test_q8_0_rounds_half_away_from_zero() -> None:
    row = torch.tensor([127.0, -127.0, 0.5, -0.5, 1.5, -2.5] + [0.0] * 26)
    assert dequantize_blocks(quantize_q8_0(row[None]))[0, :6].tolist() == [127, -127, 1, -1, 2, -3]


def test_widths_that_are_not_blocks_are_refused() -> None:
    with pytest.raises(QuantizationError, match=r"in a multiple of 32, got \[4, 48\]"):
        quantize_q4_1(torch.zeros(4, 48))
    rows = torch.zeros(4, 144, dtype=torch.uint8)
    with pytest.raises(
        QuantizationError, match=r"q4_k needs \[out, in\] weights with in a multiple of 256"
    ):
        QuantWeight.pack(GgufBlocks("Q4_K", rows, (4, 128)))


def test_a_wrong_byte_count_is_refused_by_the_op() -> None:
    weight = QuantWeight.pack(quantize_q8_0(torch.randn(16, 64)))
    with pytest.raises(RuntimeError, match="packed q8_0 weights for 16 x 64 must be"):
        torch.ops.nanoserve.linear(torch.randn(1, 64), [weight.packed[:-1]], [8], [16], None)
    with pytest.raises(RuntimeError, match="f16 has no dot kernel"):
        torch.ops.nanoserve.linear(torch.randn(1, 64), [weight.packed], [1], [16], None)


# -- products exact where the arithmetic is ---------------------------------------------------


def fp16(x: float) -> bytes:
    return struct.pack("<e", x)


def integer_activations(rows: int, width: int, seed: int) -> torch.Tensor:
    """Integers in [-127, 127] with a 127 in every group: they quantize to themselves (scale 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-127, 128, (rows, width), generator=g).float()
    x[:, ::32] = 127.0
    return x


def test_q4_0_product_is_exact_on_integers() -> None:
    # d = 1: w = q - 8 for the levels (f + i) % 16; 17 features cross a 16-feature block.
    out, width = 17, 64
    q = np.array([[(f + i) % 16 for i in range(width)] for f in range(out)], dtype=np.uint8)
    blocks = bytearray()
    for f in range(out):
        for g in range(width // 32):
            lv = q[f, 32 * g : 32 * g + 32]
            blocks += fp16(1.0) + bytes(int(lv[j]) | (int(lv[j + 16]) << 4) for j in range(16))
    rows = np.frombuffer(bytes(blocks), np.uint8).reshape(out, -1).copy()
    linear = QuantLinear((QuantWeight.pack(blocks_of("Q4_0", rows, width)),))
    x = integer_activations(5, width, seed=1)
    expected = x.long() @ (torch.from_numpy(q).long() - 8).T  # exact integers
    assert torch.equal(linear.matmul(x), expected.float())


def test_q6_k_product_is_exact_on_integers() -> None:
    # d = 1 and every 16-input scale 1: w = q - 32 exactly, through the per-half offsets.
    out, width = 16, 256
    g = np.random.default_rng(2)
    raw = g.integers(0, 256, (out, 210), dtype=np.uint8)
    raw[:, 192:208] = 1  # the 16 int8 scales
    raw[:, 208:210] = np.frombuffer(fp16(1.0), np.uint8)
    w = gguf_values("Q6_K", raw, width)
    linear = QuantLinear((QuantWeight.pack(blocks_of("Q6_K", raw, width)),))
    x = integer_activations(3, width, seed=3)
    assert torch.equal(linear.matmul(x), (x.long() @ w.long().T).float())


def test_q8_0_product_is_exact_on_integers() -> None:
    out, width = 20, 96
    g = np.random.default_rng(4)
    raw = g.integers(0, 256, (out, width // 32, 34), dtype=np.uint8)
    raw[..., 0:2] = np.frombuffer(fp16(1.0), np.uint8)
    raw = raw.reshape(out, -1)
    w = gguf_values("Q8_0", raw, width)
    linear = QuantLinear((QuantWeight.pack(blocks_of("Q8_0", raw, width)),))
    x = integer_activations(7, width, seed=5)
    assert torch.equal(linear.matmul(x), (x.long() @ w.long().T).float())


def test_every_mxfp4_scale_byte_is_ggmls_power_of_two(runnable_isas: list[str]) -> None:
    """MXFP4's E8M0 scale, each of its 256 bytes (0 and 1 ggml's subnormals, 255 not NaN but
    2^127): dequantized as the `gguf` package does, and, up to where a product would overflow,
    the dot kernel the float64 product of those values, the same bits on every ISA path."""
    g = torch.Generator().manual_seed(9)
    codes = torch.randint(0, 256, (256, 2, 16), generator=g, dtype=torch.uint8)
    scales = torch.arange(256, dtype=torch.uint8).reshape(256, 1, 1).expand(256, 2, 1)
    rows = torch.cat((scales, codes), -1).reshape(256, 34).numpy()
    with np.errstate(over="ignore"):  # 12 * 2^127 is inf, in both
        expected = gguf_values("MXFP4", rows, 64)
    assert torch.equal(dequantize_blocks(blocks_of("MXFP4", rows, 64)), expected)
    finite = rows[:200]  # 12 * 2^71 * |x| stays far below float32's range
    linear = QuantLinear((QuantWeight.pack(blocks_of("MXFP4", finite, 64)),))
    x = torch.randn(3, 64, generator=g)
    results = on_every_isa(runnable_isas, lambda: linear.matmul(x))
    assert_same_bits(results)
    check_against_float64(results["portable"], gguf_values("MXFP4", finite, 64), x)
