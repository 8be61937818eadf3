"""MemoryPlan: how an engine's `--kv-budget` is spent: a hybrid's recurrent state first (a
slot per running sequence, the checkpoints its prefix cache keeps, and the sink), then K/V
blocks for the attention layers in what is left.

A model without recurrent layers plans no state and all of the budget goes to K/V. An encoder
keeps neither: its pool is a ledger of the positions in flight (blocks with no
bytes), enough for `max_batch` inputs of `max_model_len`. A hybrid's
prefix cache needs checkpoints (core/state_checkpoints.py): with none (`--state-checkpoints 0`,
or a budget too small for one), its prefix cache is off.
"""

from __future__ import annotations

from dataclasses import dataclass

from nanoserve.core import KVPoolPlan, PoolBudgetError, plan_kv_pool
from nanoserve.core.kv_cache_dtype import KvCacheDtype
from nanoserve.core.state_checkpoints import CheckpointRule, auto_checkpoints
from nanoserve.core.state_pool_plan import StatePoolPlan
from nanoserve.runtime.engine.config.engine_config import ResolvedConfig
from nanoserve.runtime.loading.model_config import ModelConfig


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    state: StatePoolPlan
    kv: KVPoolPlan
    # Where states are saved for the prefix cache; None: no recurrent state, or no checkpoints
    checkpoints: CheckpointRule | None
    prefix_caching: bool  # the prefix cache is on for this model

    @property
    def total_bytes(self) -> int:
        return self.state.total_bytes + self.kv.total_bytes


def plan_memory(cfg: ModelConfig, config: ResolvedConfig, kv_dtype: KvCacheDtype) -> MemoryPlan:
    running = StatePoolPlan(config.max_batch, cfg.state_shapes)
    caching = config.enable_prefix_cache
    checkpoints = 0
    if running.tensors and caching:
        wanted = config.state_checkpoints
        checkpoints = (
            auto_checkpoints(config.max_batch, running.bytes_per_slot, config.kv_budget_bytes)
            if wanted == "auto"
            else int(wanted)
        )
    state = StatePoolPlan(config.max_batch + checkpoints, cfg.state_shapes, checkpoints)
    if state.total_bytes >= config.kv_budget_bytes:
        raise PoolBudgetError(
            f"the K/V budget of {config.kv_budget_bytes} bytes cannot hold the recurrent state:"
            f" {state.num_slots} slots and the sink of {state.bytes_per_slot} bytes need"
            f" {state.total_bytes} ({checkpoints} of them checkpoints); raise --kv-budget or"
            " lower --max-batch or --state-checkpoints"
        )
    if not cfg.attention_layers:  # an encoder keeps no K/V: its blocks count positions only
        blocks = config.max_batch * -(-config.max_model_len // config.block_size)
        kv = KVPoolPlan(
            0, cfg.num_kv_heads, cfg.head_dim, kv_dtype.torch_dtype, config.block_size, blocks
        )
        return MemoryPlan(state, kv, None, False)
    kv = plan_kv_pool(
        num_layers=len(cfg.kv_layers),
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        dtype=kv_dtype.torch_dtype,
        block_size=config.block_size,
        budget_bytes=config.kv_budget_bytes - state.total_bytes,
        forms=kv_dtype,
        layer_shapes=cfg.kv_layer_shapes,
    )
    rule = (
        CheckpointRule(config.block_size, config.state_checkpoint_interval) if checkpoints else None
    )
    return MemoryPlan(state, kv, rule, caching and (not state.tensors or rule is not None))
