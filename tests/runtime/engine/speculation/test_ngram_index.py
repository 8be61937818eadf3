"""NgramIndex: prompt lookup, incrementally, against a brute-force search."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.runtime.engine.speculation.ngram_index import NgramIndex


def brute_force(tokens: list[int], min_n: int, max_n: int, limit: int) -> tuple[int, ...]:
    """The continuation of the last earlier occurrence of the longest matching suffix."""
    length = len(tokens)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):
            if tokens[end - n : end] == suffix:
                return tuple(tokens[end : end + limit])
    return ()


def test_the_continuation_of_an_earlier_occurrence() -> None:
    index = NgramIndex(1, 3)
    assert index.propose([1, 2, 3, 4, 1, 2], 3) == (3, 4, 1)
    assert index.propose([1, 2, 3, 4, 1, 2], 0) == ()


def test_the_longest_suffix_wins_then_the_latest_occurrence() -> None:
    tokens = [5, 1, 2, 9, 7, 1, 2, 8, 5, 1, 2]
    assert NgramIndex(2, 3).propose(tokens, 2) == (9, 7)  # (5, 1, 2), not the later (1, 2)
    assert NgramIndex(2, 2).propose(tokens, 2) == (8, 5)  # (1, 2): its latest occurrence
    assert NgramIndex(2, 3).propose([1, 2, 3, 4], 2) == ()  # nothing repeats


def test_a_proposal_stops_at_the_end() -> None:
    assert NgramIndex(1, 1).propose([7, 7, 7], 4) == (7,)


def test_sizes_are_checked() -> None:
    with pytest.raises(ValueError, match="1 <= min <= max"):
        NgramIndex(3, 2)


@given(
    tokens=st.lists(st.integers(0, 4), min_size=1, max_size=60),
    sizes=st.tuples(st.integers(1, 3), st.integers(0, 2)),
    limit=st.integers(1, 6),
)
def test_growing_one_token_at_a_time_matches_a_search(tokens, sizes, limit) -> None:
    min_n, max_n = sizes[0], sizes[0] + sizes[1]
    index = NgramIndex(min_n, max_n)
    for end in range(1, len(tokens) + 1):
        prefix = tokens[:end]
        assert index.propose(prefix, limit) == brute_force(prefix, min_n, max_n, limit)
