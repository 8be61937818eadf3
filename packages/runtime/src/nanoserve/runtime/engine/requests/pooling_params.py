"""PoolingParams: what a pooling request (an embedding, or a score) asks of the engine.

A pooling request is prefill only: its prompt is run through the model, its hidden states are
pooled as the model's pooler says (loading/pooler_config.py), and the answer is one vector (or
one score). It samples nothing, keeps no K/V after its answer, and is checked at the door like
a generating request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from nanoserve.core.errors import FieldError
from nanoserve.runtime.engine.requests.request_check import RequestError
from nanoserve.runtime.loading.model_config import ModelConfig
from nanoserve.runtime.model.pooler import Pooler

PoolingTask = Literal["embed", "score"]


class PoolingParamsError(FieldError):
    """A pooling field is out of range; `field` names it (the API maps it to `param`)."""


@dataclass(frozen=True, slots=True)
class PoolingParams:
    task: PoolingTask = "embed"  # "embed": the pooled vector; "score": the scoring head's value
    dimensions: int | None = None  # a Matryoshka truncation of the embedding (None: all)
    normalize: bool | None = None  # None: as the model's config says

    @property
    def n(self) -> int:
        """One answer per request (the queue counts samples)."""
        return 1

    def __post_init__(self) -> None:
        if self.task not in ("embed", "score"):
            raise PoolingParamsError("task", f"must be 'embed' or 'score', got {self.task!r}")
        dims = self.dimensions
        if dims is not None and (not isinstance(dims, int) or isinstance(dims, bool) or dims < 1):
            raise PoolingParamsError("dimensions", f"must be an integer >= 1, got {dims!r}")
        if self.task == "score" and dims is not None:
            raise PoolingParamsError("dimensions", "applies to embeddings, not scores")


def check_pooling(
    prompt_ids: Sequence[int],
    params: PoolingParams,
    pooler: Pooler,
    config: ModelConfig,
    limit: int,
) -> None:
    """RequestError unless the model pools and can answer this: a pooling task it serves, a
    prompt of tokens in its vocabulary within `limit` (the context, or the pool if smaller),
    and `dimensions` no wider than its embedding."""
    task = pooler.task
    if task == "generate":
        raise RequestError("model", "this model generates; it serves no embeddings or scores")
    if params.task == "score" and task != "rerank":
        raise RequestError("model", f"this model serves {task}, not scores")
    if params.task == "embed" and task != "embed":
        raise RequestError("model", f"this model serves {task}, not embeddings")
    vocab = config.vocab_size
    if not prompt_ids:
        raise RequestError("input", "the input is empty")
    if any(not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab for t in prompt_ids):
        raise RequestError("input", f"input token ids must be in [0, {vocab})")
    if len(prompt_ids) > limit:
        raise RequestError(
            "input", f"the input ({len(prompt_ids)} tokens) exceeds the {limit}-token limit"
        )
    width = pooler.dimensions or config.hidden_size
    if params.dimensions is not None and params.dimensions > width:
        raise RequestError(
            "dimensions", f"must be at most the embedding's {width}, got {params.dimensions}"
        )
