"""NgramIndex: prompt lookup over one sequence's tokens, updated as they grow.

A proposal is what followed the last earlier occurrence of the sequence's last n tokens, for
the longest n from `max_n` down to `min_n` that occurred before. The index maps each n-gram to
the position just past its latest occurrence, so a lookup is one dict probe per n and a new
token costs one insert per n: a 4,000-token prompt is indexed once (~10 ms), not searched
every step. The sequence's own suffix is indexed only after the lookup that uses it, so a
match is always an earlier occurrence.
"""

from __future__ import annotations

from collections.abc import Sequence as Seq

from nanoserve.core.draft_budget import Acceptance
from nanoserve.runtime.engine.step.sequence import Sequence


class NgramIndex:
    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min <= max, got {min_n}, {max_n}")
        self.min_n = min_n
        self.max_n = max_n
        self._ends: dict[tuple[int, ...], int] = {}  # n-gram -> the position just past it
        self._indexed = 0  # n-grams ending before this position are in _ends

    def propose(self, tokens: Seq[int], limit: int) -> tuple[int, ...]:
        """Up to `limit` tokens that followed the last earlier occurrence of tokens' longest
        matching suffix; () when no suffix of min_n or more occurred before."""
        length = len(tokens)
        self._index_until(tokens, length)  # every n-gram ending before the suffix's end
        if limit < 1:
            return ()
        for n in range(min(self.max_n, length - 1), self.min_n - 1, -1):
            end = self._ends.get(tuple(tokens[length - n :]))
            if end is not None:
                return tuple(tokens[end : min(end + limit, length)])
        return ()

    def _index_until(self, tokens: Seq[int], stop: int) -> None:
        """Index the n-grams whose ends lie in [_indexed, stop): an occurrence's end is the
        position after it, where its continuation starts (the suffix itself ends at stop)."""
        for end in range(max(self._indexed, 1), stop):
            for n in range(self.min_n, min(self.max_n, end) + 1):
                self._ends[tuple(tokens[end - n : end])] = end
        self._indexed = max(self._indexed, stop)


class PromptLookup:
    """The Speculator's proposer for method "ngram" (speculator.Proposer): one NgramIndex per
    sequence. A lookup is free, so the proposals come first and the pricing takes from them."""

    priced_first = False
    steady = True  # never timed: a lookup costs nothing
    prior = Acceptance()  # a text's n-grams may not recur: one success in two

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n = min_n
        self.max_n = max_n
        self._indexes: dict[int, NgramIndex] = {}

    def propose(self, wants: Seq[tuple[Sequence, int]]) -> dict[int, tuple[int, ...]]:
        proposals = {}
        for seq, limit in wants:
            index = self._indexes.get(seq.seq_id)
            if index is None:
                index = self._indexes[seq.seq_id] = NgramIndex(self.min_n, self.max_n)
            if proposal := index.propose(seq.token_ids(), limit):
                proposals[seq.seq_id] = proposal
        return proposals

    def forget(self, seq_id: int) -> None:
        self._indexes.pop(seq_id, None)

    def check_blocks(self, idle: bool) -> None:
        """Prompt lookup holds no K/V: nothing to check."""

    def describe(self) -> str:
        return f"prompt lookup of {self.min_n}..{self.max_n}-grams"
