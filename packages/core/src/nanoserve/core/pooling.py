"""Pooling: how a prompt's hidden states become one vector (an embedding, or a score's input).

A pooling request is prefill only, and its prompt may arrive in chunks (chunked prefill). Each
chunk gives the final-normed hidden states of the rows `kept_rows` names, and `accumulate` folds
them into what the sequence carries between steps; `finish` turns that into the pooled vector
once the last chunk is in:

- "last": the prompt's last token (decoder embedders: Qwen3-Embedding; rerankers' scores);
- "mean": the mean over every prompt token, summed in float64 chunk by chunk (so the chunking
  leaves no trace: the sum of the chunks' sums is the whole prompt's, to float64 rounding);
- "cls": the prompt's first token (BERT-style embedders).

`normalize` and `truncate` are what the model's config (or the request) asks afterwards: an L2
normalization, and a Matryoshka truncation to the leading `dimensions`, re-normalized.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch

from nanoserve.core.errors import NanoserveError


class PoolingError(NanoserveError, ValueError):
    """A pooling request the model cannot serve (a dimension it does not have)."""


class PoolingMethod(enum.Enum):
    LAST = "last"
    MEAN = "mean"
    CLS = "cls"


@dataclass(frozen=True, slots=True)
class ChunkRows:
    """Which rows of one prompt chunk a pooling sequence keeps: [start, stop) of the chunk."""

    start: int
    stop: int

    @property
    def count(self) -> int:
        return self.stop - self.start


def kept_rows(method: PoolingMethod, first: int, length: int, prompt_len: int) -> ChunkRows:
    """The rows of a chunk of `length` tokens starting at prompt position `first` that the
    method reads (none: an empty range)."""
    if length < 1 or first < 0 or first + length > prompt_len:
        raise PoolingError(
            f"a chunk of {length} tokens at {first} does not lie in a {prompt_len}-token prompt"
        )
    if method is PoolingMethod.MEAN:
        return ChunkRows(0, length)
    if method is PoolingMethod.CLS:
        return ChunkRows(0, 1) if first == 0 else ChunkRows(0, 0)
    last = first + length == prompt_len
    return ChunkRows(length - 1, length) if last else ChunkRows(length, length)


def accumulate(
    method: PoolingMethod, carried: torch.Tensor | None, rows: torch.Tensor
) -> torch.Tensor | None:
    """What a sequence carries after a chunk's kept `rows` [n, hidden]: the running float64 sum
    for "mean", else the one row kept (float32)."""
    if rows.shape[0] == 0:
        return carried
    if method is PoolingMethod.MEAN:
        total = rows.double().sum(dim=0)
        return total if carried is None else carried + total
    return rows[-1].float()


def finish(method: PoolingMethod, carried: torch.Tensor | None, prompt_len: int) -> torch.Tensor:
    """The pooled vector (float32) of a whole prompt."""
    if carried is None:
        raise PoolingError(f"no hidden state was kept for a {prompt_len}-token prompt")
    if method is PoolingMethod.MEAN:
        return (carried / prompt_len).float()
    return carried.float()


def normalize(vector: torch.Tensor) -> torch.Tensor:
    """L2-normalized (a zero vector stays zero), as sentence-transformers' Normalize."""
    return torch.nn.functional.normalize(vector.float(), p=2.0, dim=-1)


def truncate(vector: torch.Tensor, dimensions: int | None, *, renormalize: bool) -> torch.Tensor:
    """The leading `dimensions` values (a Matryoshka embedding), re-normalized when the model
    normalizes; None keeps every value."""
    if dimensions is None:
        return vector
    size = vector.shape[-1]
    if not 1 <= dimensions <= size:
        raise PoolingError(f"dimensions must be in [1, {size}] for this model, got {dimensions}")
    kept = vector[..., :dimensions]
    return normalize(kept) if renormalize else kept


__all__ = [
    "ChunkRows",
    "PoolingError",
    "PoolingMethod",
    "accumulate",
    "finish",
    "kept_rows",
    "normalize",
    "truncate",
]
