"""measure_draft_cost: the boot's timing of what a draft token costs, for the Speculator.

Four forwards over padding, each the fastest of five rounds after a first, the four taken in
turn (on prefill_timing.py's scratch pool of one block): a decode step of one row and of
`max_batch` rows (the prefill budget's own, reused when it measured them), a verify chunk of one
token, and one of 1 + k tokens with logits at every position, as a verify row computes them. The output
projection per position is part of a draft token's price: on a 150k vocabulary it is a third
of a small model's arithmetic per token. With a draft model, a fifth: its decode step of one
row, what proposing one token costs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch

from nanoserve.core import DecodePlan, KVPoolPlan, PrefillBudget, PrefillPlan
from nanoserve.core.draft_budget import DraftCost
from nanoserve.runtime.engine.draft_model import DraftModel
from nanoserve.runtime.engine.prefill_timing import padding_decode, padding_prefill
from nanoserve.runtime.engine.speculative_config import SpeculativeConfigError
from nanoserve.runtime.engine.speculator import Speculator
from nanoserve.runtime.engine_config import ResolvedConfig
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel

ROUNDS = 5


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
        cfg = on.config
        pool_plan = KVPoolPlan(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, on.kv_dtype, 1, 1)
        pool = KVPool(pool_plan, device)

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


def fastest_interleaved(runs: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Each run's fastest of ROUNDS, the runs taken in turn: a burst of another process's work
    slows one round of each, not every round of one (which would misprice it)."""
    best = dict.fromkeys(runs, float("inf"))
    with torch.inference_mode():
        for run in runs.values():
            run()  # the first call pays for allocations and page faults
        for _ in range(ROUNDS):
            for name, run in runs.items():
                started = time.perf_counter()
                run()
                best[name] = min(best[name], time.perf_counter() - started)
    return best


def build_speculator(
    model: LlamaModel,
    config: ResolvedConfig,
    budget: PrefillBudget | None,
    pool_plan: KVPoolPlan,
    draft: LlamaModel | None = None,
) -> Speculator | None:
    """The config's speculation, priced on this model (None: speculation is off). A draft
    model's pool holds the target pool's positions and each row's draft."""
    spec = config.speculative
    if spec is None:
        return None
    if (spec.method == "draft_model") != (draft is not None):
        raise SpeculativeConfigError(
            f"speculative method {spec.method} "
            + ("needs a draft model" if draft is None else "takes no draft model")
        )
    cost = measure_draft_cost(
        model,
        drafts=spec.num_speculative_tokens,
        max_batch=config.max_batch,
        budget=budget,
        draft=draft,
    )
    proposer = None
    if draft is not None:
        proposer = DraftModel.with_pool(
            draft,
            slots=pool_plan.num_slots + config.max_batch * spec.num_speculative_tokens,
            block_size=pool_plan.block_size,
            max_len=config.max_model_len,
            vocab=model.config.vocab_size,
            name=Path(spec.model or "draft").name,
            catch_up=config.max_num_batched_tokens,
        )
        # Resident now, as the target's pool is after the warm-up: memory it cannot have
        # fails the boot, not the first request that drafts
        proposer.pool.touch()
    return Speculator(spec, cost, config.max_model_len, config.max_batch, proposer)
