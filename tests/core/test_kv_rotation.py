"""The Hadamard turn of a block pool's rows (core/kv_rotation.py): llama.cpp's widths, the
matrix it is, and its own inverse."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.core.kv_rotation import hadamard, rotation_width


def sylvester(width: int) -> torch.Tensor:
    """H[i][j] = (-1)^popcount(i & j) / sqrt(width), float64."""
    signs = torch.tensor([[bin(a & b).count("1") % 2 for b in range(width)] for a in range(width)])
    return (1 - 2 * signs).double() / width**0.5


@pytest.mark.parametrize(
    ("form", "head_dim", "k_width", "v_width"),
    [
        ("q8_0", 64, 64, 64),
        ("q8_0", 128, 128, 64),
        ("q4_0", 256, 256, 64),
        ("q8_0", 192, 64, 64),  # 64 is the largest power of two dividing 192
        ("q8_0", 96, 0, 0),  # not a multiple of 64: not turned
        ("float16", 128, 0, 0),  # a float form is never turned
        ("bfloat16", 64, 0, 0),
    ],
)
def test_widths_are_llama_cpps(form: str, head_dim: int, k_width: int, v_width: int) -> None:
    assert rotation_width(form, head_dim, v=False) == k_width
    assert rotation_width(form, head_dim, v=True) == v_width


@pytest.mark.parametrize("width", [64, 128, 256])
def test_the_turn_is_sylvesters_matrix_chunk_by_chunk(width: int) -> None:
    x = torch.randn(3, 2 * width, generator=torch.Generator().manual_seed(width))
    chunks = x.double().reshape(-1, width)
    want = (chunks @ sylvester(width).T).reshape(x.shape)
    assert torch.allclose(hadamard(x, width).double(), want, rtol=0, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([64, 128]), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_the_turn_is_its_own_inverse_and_keeps_dots(width: int, chunks: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, chunks * width, generator=g)
    back = hadamard(hadamard(k, width), width)
    assert torch.allclose(back, k, rtol=0, atol=1e-5)
    turned = float(hadamard(q, width) @ hadamard(k, width))
    assert abs(turned - float(q @ k)) <= 1e-4 * (1 + float(q.norm() * k.norm()))


def test_an_outlier_is_spread_over_its_chunk() -> None:
    x = torch.zeros(64)
    x[5] = 64.0
    assert torch.equal(hadamard(x, 64).abs(), torch.full((64,), 8.0))
