"""Attention over whole inputs, both ways: against a float64 softmax written out, with grouped
K/V heads, a window on both sides, and inputs laid end to end that never see each other."""

from __future__ import annotations

import itertools

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.runtime.model.whole_attention import whole_attention, window_mask


def _reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None
) -> torch.Tensor:
    n, heads, dim = q.shape
    group = heads // k.shape[1]
    out = torch.empty(n, heads, dim, dtype=torch.float64)
    for h in range(heads):
        scores = q[:, h].double() @ k[:, h // group].double().T * dim**-0.5
        for i in range(n):
            for j in range(n):
                if window is not None and abs(i - j) >= window:
                    scores[i, j] = float("-inf")
        out[:, h] = scores.softmax(-1) @ v[:, h // group].double()
    return out.reshape(n, heads * dim)


def test_window_mask_exact() -> None:
    assert window_mask(4, 2).int().tolist() == [
        [1, 1, 0, 0],
        [1, 1, 1, 0],
        [0, 1, 1, 1],
        [0, 0, 1, 1],
    ]


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    window=st.one_of(st.none(), st.integers(1, 6)),
    seed=st.integers(0, 1000),
)
def test_each_input_alone_against_float64(
    lengths: list[int], window: int | None, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    total = sum(lengths)
    q = torch.randn(total, 4, 8, generator=generator)
    k, v = (torch.randn(total, 2, 8, generator=generator) for _ in range(2))
    starts = tuple(sum(lengths[:i]) for i in range(len(lengths) + 1))
    got = whole_attention(q, k, v, starts, window=window)
    assert got.shape == (total, 32) and got.dtype == torch.float32
    for a, b in itertools.pairwise(starts):
        expected = _reference(q[a:b], k[a:b], v[a:b], window)
        torch.testing.assert_close(got[a:b].double(), expected, rtol=0, atol=1e-5)
        alone = whole_attention(q[a:b], k[a:b], v[a:b], (0, b - a), window=window)
        assert torch.equal(alone, got[a:b])  # an input's rows ignore the others
