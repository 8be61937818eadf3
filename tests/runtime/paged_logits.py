"""Logits at every position of one prompt, through a fresh paged pool: the model tests' one way
to compare a forward with transformers' (shared; test modules cannot import each other)."""

from __future__ import annotations

import torch

from nanoserve.core import BlockTable, PrefillChunk, plan_kv_pool, plan_prefill
from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.runtime.model.kv_pool import KVPool
from nanoserve.runtime.model.llama import LlamaModel
from nanoserve.runtime.model.state_pool import StatePool

BLOCK = 4


def fresh_pool(model: LlamaModel, max_blocks: int, state_slots: int = 1) -> KVPool:
    """An empty pool of `max_blocks` blocks of BLOCK slots in the model's K/V dtype (its
    attention layers'), and `state_slots` slots of its recurrent state (if any)."""
    cfg = model.config
    plan = plan_kv_pool(
        num_layers=len(cfg.kv_layers),
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        dtype=model.kv_dtype,
        block_size=BLOCK,
        budget_bytes=1 << 28,
        max_blocks=max_blocks,
        layer_shapes=cfg.kv_layer_shapes,
    )
    return KVPool(plan, states=StatePool(StatePoolPlan(state_slots, cfg.state_shapes)))


def paged_logits(model: LlamaModel, ids: list[int], chunk: int | None = None) -> torch.Tensor:
    """[tokens, vocab] float32: the prompt fed in chunks (default: whole), its blocks handed out
    backwards so that a position's slot is never its index."""
    pool = fresh_pool(model, max_blocks=-(-len(ids) // BLOCK) + 1)
    plan = pool.plan
    table = BlockTable(BLOCK, reversed(range(plan.num_blocks)))
    chunk = chunk or len(ids)
    out = []
    for start in range(0, len(ids), chunk):
        piece = tuple(ids[start : start + chunk])
        prefill = plan_prefill(
            [PrefillChunk(0, piece, start, table, state_slot=0)],
            sink_slot=plan.sink_slot,
            sink_state_slot=pool.sink_state_slot,
        )
        rows = torch.arange(len(piece))
        out.append(model.forward(prefill, pool.view((0,)), logit_rows=rows))
    return torch.cat(out)


def rel_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest difference, relative to the reference's largest magnitude."""
    return float((ours - ref).abs().max() / ref.abs().max())
