"""PoolingState: what a pooling sequence carries between its prompt's chunks, and its answer;
PoolingCounts: the engine's count of what it pooled (for /metrics)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoserve.core.pooling import PoolingMethod
from nanoserve.runtime.engine.requests.pooling_params import PoolingParams


@dataclass(slots=True)
class PoolingState:
    params: PoolingParams
    method: PoolingMethod
    carried: torch.Tensor | None = None  # what core.pooling.accumulate keeps between chunks
    result: tuple[float, ...] | None = None  # the answer: an embedding, or (score,)


@dataclass(slots=True)
class PoolingCounts:
    """Pooling requests answered, and their prompt tokens (for /metrics)."""

    requests: int = 0
    tokens: int = 0
