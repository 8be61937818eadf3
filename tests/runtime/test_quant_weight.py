"""Q4/Q8 levels and packed weights: llama.cpp's rounding, GGUF blocks read exactly, the packed
layout read back, and the kernels' products exact where the arithmetic is."""

from __future__ import annotations

import struct

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.runtime.errors import QuantizationError
from nanoserve.runtime.model.quant_weight import Q4Levels, Q8Levels


def fp16(x: float) -> bytes:
    return struct.pack("<e", x)


def test_q4_quantize_is_llamacpp_rounding() -> None:
    # One group spanning 0..15 in steps of 1: d = 1, m = 0, and the levels are the values.
    row = torch.tensor([float(i % 16) for i in range(32)])
    levels = Q4Levels.quantize(row[None])
    assert levels.q[0].tolist() == [i % 16 for i in range(32)]
    assert levels.d.tolist() == [[1.0]] and levels.m.tolist() == [[0.0]]
    # (x - min) / d + 0.5, truncated: 0.5 rounds up, 0.49 down (llama.cpp, not half-to-even).
    row = torch.tensor([0.0, 15.0, 0.5, 0.49, 2.5, 3.5] + [0.0] * 26)
    assert Q4Levels.quantize(row[None]).q[0, :6].tolist() == [0, 15, 1, 0, 3, 4]


def test_q4_constant_group_has_zero_scale() -> None:
    levels = Q4Levels.quantize(torch.full((1, 32), 3.0))
    assert levels.d.tolist() == [[0.0]] and levels.m.tolist() == [[3.0]]
    assert levels.q.unique().tolist() == [0]
    assert torch.equal(levels.dequantize(), torch.full((1, 32), 3.0))


def test_q8_quantize_rounds_half_away_from_zero() -> None:
    row = torch.tensor([127.0, -127.0, 0.5, -0.5, 1.5, -2.5] + [0.0] * 26)
    levels = Q8Levels.quantize(row[None])
    assert levels.d.tolist() == [[1.0]]
    assert levels.q[0, :6].tolist() == [127, -127, 1, -1, 2, -3]


def test_q4_1_blocks_are_read_as_stored() -> None:
    # d = 0.5, m = -1; byte j holds input j (low nibble) and input j + 16 (high nibble).
    qs = bytes((j % 16) | ((15 - j % 16) << 4) for j in range(16))
    block = torch.frombuffer(bytearray(fp16(0.5) + fp16(-1.0) + qs), dtype=torch.uint8)
    levels = Q4Levels.from_q4_1_blocks(block[None])
    assert levels.q[0].tolist() == list(range(16)) + list(range(15, -1, -1))
    assert levels.d.tolist() == [[0.5]] and levels.m.tolist() == [[-1.0]]
    assert levels.dequantize()[0, :3].tolist() == [-1.0, -0.5, 0.0]


def test_q4_0_blocks_are_q4_1_with_minimum_minus_8d() -> None:
    qs = bytes(8 | (9 << 4) for _ in range(16))
    block = torch.frombuffer(bytearray(fp16(0.25) + qs), dtype=torch.uint8)
    levels = Q4Levels.from_q4_0_blocks(block[None])
    assert levels.d.tolist() == [[0.25]] and levels.m.tolist() == [[-2.0]]
    assert levels.dequantize()[0].tolist() == [0.0] * 16 + [0.25] * 16


def test_q8_0_blocks_are_read_as_stored() -> None:
    qs = bytes((i - 16) & 0xFF for i in range(32))
    block = torch.frombuffer(bytearray(fp16(2.0) + qs), dtype=torch.uint8)
    levels = Q8Levels.from_q8_0_blocks(torch.stack((block, block)))
    assert levels.q[1].tolist() == [i - 16 for i in range(32)]
    assert levels.dequantize()[0, :2].tolist() == [-32.0, -30.0]


def test_widths_that_are_not_groups_are_refused() -> None:
    with pytest.raises(QuantizationError, match=r"in a multiple of 32, got \[4, 48\]"):
        Q4Levels.quantize(torch.zeros(4, 48))
    with pytest.raises(QuantizationError, match="q8 needs"):
        Q8Levels.quantize(torch.zeros(3))


@settings(max_examples=25, deadline=None)
@given(out=st.integers(1, 40), groups=st.integers(1, 4), seed=st.integers(0, 2**16))
def test_packed_layout_reads_back(out: int, groups: int, seed: int) -> None:
    w = torch.randn(out, 32 * groups, generator=torch.Generator().manual_seed(seed))
    q4, q8 = Q4Levels.quantize(w), Q8Levels.quantize(w)
    back4, back8 = q4.pack().levels(), q8.pack().levels()
    assert torch.equal(back4.q, q4.q) and torch.equal(back4.d, q4.d) and torch.equal(back4.m, q4.m)
    assert torch.equal(back8.q, q8.q) and torch.equal(back8.d, q8.d)


def test_concatenated_levels_equal_quantizing_the_concatenation() -> None:
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(16, 64, generator=g), torch.randn(8, 64, generator=g)
    joined = Q4Levels.cat([Q4Levels.quantize(a), Q4Levels.quantize(b)])
    whole = Q4Levels.quantize(torch.cat((a, b)))
    assert torch.equal(joined.q, whole.q) and torch.equal(joined.d, whole.d)


# -- the kernels' products -------------------------------------------------------------------


def exact_activations(rows: int, width: int, seed: int) -> torch.Tensor:
    """Integers in [-127, 127] with a 127 in every group: they quantize to themselves (scale 1)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-127, 128, (rows, width), generator=g).float()
    x[:, ::32] = 127.0
    return x


def test_q4_product_is_exact_on_integers() -> None:
    # Feature f: d = 1, m = 0 and levels (f + i) % 16; 17 features cross a 16-feature block.
    out, width = 17, 64
    q = torch.tensor([[(f + i) % 16 for i in range(width)] for f in range(out)], dtype=torch.uint8)
    ones = torch.ones(out, width // 32, dtype=torch.float16)
    weight = Q4Levels(q, ones, torch.zeros_like(ones)).pack()
    x = exact_activations(5, width, seed=1)
    expected = x.long() @ q.long().T  # exact integers, small enough for float32
    assert torch.equal(weight.matmul(x), expected.float())
    bias = torch.arange(out, dtype=torch.float32)
    assert torch.equal(weight.matmul(x, bias), expected.float() + bias)


def test_q4_minimum_term_is_exact() -> None:
    # d = 0.5, m = -4, every level 8: every weight is exactly 0, through the minimum's term.
    q = torch.full((16, 32), 8, dtype=torch.uint8)
    half = torch.full((16, 1), 0.5, dtype=torch.float16)
    weight = Q4Levels(q, half, torch.full_like(half, -4.0)).pack()
    assert torch.equal(weight.matmul(exact_activations(3, 32, seed=2)), torch.zeros(3, 16))


def test_q8_product_is_exact_on_integers() -> None:
    out, width = 20, 96
    g = torch.Generator().manual_seed(4)
    q = torch.randint(-128, 128, (out, width), generator=g).to(torch.int8)
    weight = Q8Levels(q, torch.ones(out, width // 32, dtype=torch.float16)).pack()
    x = exact_activations(7, width, seed=5)
    assert torch.equal(weight.matmul(x), (x.long() @ q.long().T).float())


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(2, 40), pick=st.integers(0, 39), seed=st.integers(0, 2**16))
def test_a_row_ignores_its_batch(rows: int, pick: int, seed: int) -> None:
    """Each output number has one order of operations: a row alone, or at any place in any
    batch, gives the same bits."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(48, 64, generator=g)
    x = torch.randn(rows, 64, generator=g)
    pick %= rows
    for weight in (Q4Levels.quantize(w).pack(), Q8Levels.quantize(w).pack()):
        assert torch.equal(weight.matmul(x)[pick], weight.matmul(x[pick : pick + 1])[0])


def test_product_is_close_to_the_float_product() -> None:
    """The only error besides the weights' own rounding is the activations' int8 rounding."""
    g = torch.Generator().manual_seed(6)
    w, x = torch.randn(64, 256, generator=g), torch.randn(4, 256, generator=g)
    for levels in (Q4Levels.quantize(w), Q8Levels.quantize(w)):
        reference = x @ levels.dequantize().T
        error = (levels.pack().matmul(x) - reference).abs().max() / reference.abs().max()
        assert error < 0.02
