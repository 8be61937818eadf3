"""measure_draft_cost: the boot's timing of what a draft token costs, for the Speculator.

Four forwards over padding, each the fastest of its rounds after a first, the four taken in
turn (measure.py's `fastest_interleaved`, on its scratch pool of one block): a decode step of
one row and of `max_batch` rows (the prefill budget's own, reused when it measured them), a
verify chunk of one token, and one of 1 + k tokens with logits at every position, as a verify
row computes them. The output projection per position is part of a draft token's price: on a 150k vocabulary it is a third
of a small model's arithmetic per token. With a draft model, a fifth: its decode step of one
row, what proposing one token costs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from nanoserve.core import DecodePlan, PrefillBudget, PrefillPlan, padding_decode, padding_prefill
from nanoserve.core.draft_budget import DraftCost
from nanoserve.runtime.engine.timing.measure import fastest_interleaved, scratch_pool
from nanoserve.runtime.model.llama import LlamaModel


def measure_draft_cost(
    model: LlamaModel,
    *,
    drafts: int,
    max_batch: int,
    budget: PrefillBudget | None = None,
    draft: LlamaModel | None = None,
) -> DraftCost:
    sink, device = 1, model.device  # one scratch block of one slot: the sink is slot 1

    def run(plan: DecodePlan | PrefillPlan, on: LlamaModel = model) -> Callable[[], object]:
        # A verify chunk's logits at every position, as a verify row computes them
        rows = slice(0, plan.num_tokens) if isinstance(plan, PrefillPlan) else None
        pool = scratch_pool(on)

        def forward() -> None:
            on.forward(plan, pool.empty_rows(), rows)
            if device.type == "cuda":  # the host clock must wait for the device's work
                torch.cuda.synchronize(device)

        return forward

    rows = max(2, max_batch)
    runs = {
        "one_row": run(padding_decode(1, sink, device)),
        "chunk_one": run(padding_prefill(1, sink, device)),
        "chunk": run(padding_prefill(1 + drafts, sink, device)),
    }
    reuse = budget is not None and budget.per_token_s > 0
    if not reuse:
        runs["rows"] = run(padding_decode(rows, sink, device))
    if draft is not None:
        runs["draft_row"] = run(padding_decode(1, sink, device), draft)
    best = fastest_interleaved(runs)
    if budget is not None and reuse:
        base_s, per_row_s = budget.base_s, budget.per_row_s
    else:
        per_row_s = max(0.0, (best["rows"] - best["one_row"]) / (rows - 1))
        base_s = max(0.0, best["one_row"] - per_row_s)
    one_row_s, chunk_one_s, chunk_s = best["one_row"], best["chunk_one"], best["chunk"]
    return DraftCost(
        base_s=base_s,
        per_row_s=per_row_s,
        switch_s=max(0.0, chunk_one_s - one_row_s),
        per_draft_s=max(0.0, (chunk_s - chunk_one_s) / drafts),
        propose_s=best.get("draft_row", 0.0),
    )
