"""core/pooling.py: which rows a chunk keeps, the running sums, normalization and truncation."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.core.pooling import (
    ChunkRows,
    PoolingError,
    PoolingMethod,
    accumulate,
    finish,
    kept_rows,
    normalize,
    truncate,
)

LAST, MEAN, CLS = PoolingMethod.LAST, PoolingMethod.MEAN, PoolingMethod.CLS


def test_kept_rows_by_method() -> None:
    # a 10-token prompt in chunks [0, 4) and [4, 10)
    assert kept_rows(MEAN, 0, 4, 10) == ChunkRows(0, 4)
    assert kept_rows(MEAN, 4, 6, 10) == ChunkRows(0, 6)
    assert kept_rows(CLS, 0, 4, 10) == ChunkRows(0, 1)
    assert kept_rows(CLS, 4, 6, 10).count == 0
    assert kept_rows(LAST, 0, 4, 10).count == 0
    assert kept_rows(LAST, 4, 6, 10) == ChunkRows(5, 6)
    assert kept_rows(LAST, 0, 1, 1) == ChunkRows(0, 1)


def test_a_chunk_outside_the_prompt_is_refused() -> None:
    with pytest.raises(PoolingError, match="a chunk of 4 tokens at 8 does not lie in a 10-token"):
        kept_rows(MEAN, 8, 4, 10)
    with pytest.raises(PoolingError):
        kept_rows(LAST, 0, 0, 10)


def test_accumulate_and_finish_exact_values() -> None:
    rows = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    carried = accumulate(MEAN, None, rows[:2])
    carried = accumulate(MEAN, carried, rows[2:])
    assert carried is not None and carried.dtype == torch.float64
    assert finish(MEAN, carried, 3).tolist() == [3.0, 4.0]
    assert finish(LAST, accumulate(LAST, None, rows), 3).tolist() == [5.0, 6.0]
    assert accumulate(CLS, carried, rows[:0]) is carried  # a chunk that keeps nothing
    with pytest.raises(PoolingError, match="no hidden state was kept for a 3-token prompt"):
        finish(LAST, None, 3)


def test_normalize_and_matryoshka_truncation() -> None:
    vector = torch.tensor([3.0, 4.0, 12.0])
    assert normalize(vector).tolist() == pytest.approx([3 / 13, 4 / 13, 12 / 13])
    assert truncate(vector, 2, renormalize=True).tolist() == pytest.approx([0.6, 0.8])
    assert truncate(vector, 2, renormalize=False).tolist() == [3.0, 4.0]
    assert truncate(vector, None, renormalize=True) is vector
    assert normalize(torch.zeros(3)).tolist() == [0.0, 0.0, 0.0]
    with pytest.raises(PoolingError, match=r"dimensions must be in \[1, 3\] for this model, got 4"):
        truncate(vector, 4, renormalize=True)


@settings(max_examples=60, deadline=None)
@given(
    length=st.integers(1, 40),
    cuts=st.lists(st.integers(1, 39), max_size=6),
    method=st.sampled_from(list(PoolingMethod)),
    seed=st.integers(0, 2**16),
)
def test_chunking_leaves_no_trace(
    length: int, cuts: list[int], method: PoolingMethod, seed: int
) -> None:
    """However a prompt is cut into chunks, the pooled vector is the whole prompt's."""
    hidden = torch.randn(length, 8, generator=torch.Generator().manual_seed(seed))
    bounds = sorted({0, length, *(c for c in cuts if c < length)})
    carried = None
    for first, stop in itertools.pairwise(bounds):
        rows = kept_rows(method, first, stop - first, length)
        chunk = hidden[first:stop]
        carried = accumulate(method, carried, chunk[rows.start : rows.stop])
    pooled = finish(method, carried, length)
    expected = {LAST: hidden[-1], CLS: hidden[0], MEAN: hidden.double().mean(0).float()}[method]
    torch.testing.assert_close(pooled, expected, rtol=0, atol=1e-6)
