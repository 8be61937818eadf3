"""What a step's commit does with a pooling sequence's hidden states.

A pooling request runs its prompt and nothing else: each of its chunks is scheduled with the
rows its pooling method reads (`ScheduledSeq.pool`, core/pooling.py `kept_rows`), the runner
returns those rows' final-normed hidden states, and `commit_pooled` folds them into the
sequence's `PoolingState` (pooling_state.py). When the prompt's last chunk is in, the model's pooler (model/
pooler.py) makes the answer, an embedding or a score, and the sequence finishes: its blocks are
freed with it, and it never enters the prefix cache (its K/V is not kept after the answer).
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Sequence as Seq

import torch

from nanoserve.core.pooling import accumulate, finish
from nanoserve.runtime.engine.step.scheduler import ScheduledSeq
from nanoserve.runtime.engine.step.sequence import Sequence
from nanoserve.runtime.model.pooler import Pooler


def commit_pooled(
    seqs: Seq[Sequence],
    scheduled: Seq[ScheduledSeq],
    hidden: Mapping[int, torch.Tensor],
    pooler: Pooler,
) -> int:
    """After the scheduler's commit: fold each pooling row's hidden states into its sequence,
    and finish those whose prompt is now computed. Returns the prompt tokens they pooled."""
    pooled = 0
    for seq, item in zip(seqs, scheduled, strict=True):
        state = seq.pooling
        if state is None or item.pool is None:
            continue
        rows = hidden.get(seq.seq_id)
        if rows is not None:
            state.carried = accumulate(state.method, state.carried, rows)
        if seq.num_computed < len(seq.prompt_ids):
            continue
        vector = finish(state.method, state.carried, len(seq.prompt_ids))
        if state.params.task == "score":
            state.result = (pooler.score(vector),)
        else:
            embedding = pooler.embed(
                vector, dimensions=state.params.dimensions, normalizes=state.params.normalize
            )
            state.result = tuple(embedding.tolist())
        state.carried = None
        seq.finish("stop")
        pooled += len(seq.prompt_ids)
    return pooled
