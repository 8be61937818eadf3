"""KVPoolPlan: how many K/V blocks fit a byte budget, and where the sink slot is."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nanoserve.core.errors import GeometryError, NanoserveError, require_positive
from nanoserve.core.kv_cache_dtype import KvCacheDtype


class PoolBudgetError(NanoserveError):
    """The byte budget cannot hold a single block (plus the sink slot)."""


@dataclass(frozen=True, slots=True)
class KVPoolPlan:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int
    num_blocks: int
    # How K and V are stored (core/kv_cache_dtype.py); None: both as `dtype`'s float values.
    # A pool of GGUF blocks has dtype uint8.
    forms: KvCacheDtype | None = None
    # Each layer's own (kv_heads, head_dim) where layers differ (Gemma 4's full layers keep
    # fewer, wider heads than its sliding ones); (): every layer is (num_kv_heads, head_dim).
    layer_shapes: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.forms is not None and self.forms.torch_dtype != self.dtype:
            raise GeometryError(
                f"a {self.forms} pool stores {self.forms.torch_dtype}, not {self.dtype}"
            )
        if self.layer_shapes and len(self.layer_shapes) != self.num_layers:
            raise GeometryError(
                f"{len(self.layer_shapes)} layer shapes for a pool of {self.num_layers} layers"
            )
        for heads, dim in self.layer_shapes:
            require_positive(layer_kv_heads=heads, layer_head_dim=dim)

    def layer_shape(self, layer: int) -> tuple[int, int]:
        """(kv_heads, head_dim) of one layer's K and V."""
        if self.layer_shapes:
            return self.layer_shapes[layer]
        return self.num_kv_heads, self.head_dim

    def layer_row_bytes(self, layer: int) -> int:
        """One slot's K and V of one head of `layer`."""
        return self.kv_cache_dtype.row_bytes(self.layer_shape(layer)[1])

    @property
    def kv_cache_dtype(self) -> KvCacheDtype:
        return self.forms or KvCacheDtype.of(self.dtype)

    @property
    def row_bytes(self) -> int:
        """One slot's K and V of one head."""
        return self.kv_cache_dtype.row_bytes(self.head_dim)

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def sink_slot(self) -> int:
        # One past every slot the allocator hands out: padded rows write here, no table names it.
        return self.num_slots

    @property
    def bytes_per_slot(self) -> int:
        """K and V of one token position across every layer."""
        if not self.layer_shapes:
            return self.num_layers * self.num_kv_heads * self.row_bytes
        return sum(
            heads * self.layer_row_bytes(layer)
            for layer, (heads, _) in enumerate(self.layer_shapes)
        )

    @property
    def bytes_per_block(self) -> int:
        return self.bytes_per_slot * self.block_size

    @property
    def total_bytes(self) -> int:
        return self.bytes_per_slot * (self.num_slots + 1)

    def as_dict(self) -> dict[str, int | str | list[list[int]]]:
        shapes: dict[str, int | str | list[list[int]]] = (
            {"layer_shapes": [list(s) for s in self.layer_shapes]} if self.layer_shapes else {}
        )
        return shapes | {
            "num_layers": self.num_layers,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "dtype": str(self.dtype).removeprefix("torch."),
            "kv_cache_dtype": str(self.kv_cache_dtype),
            "block_size": self.block_size,
            "num_blocks": self.num_blocks,
            "num_slots": self.num_slots,
            "sink_slot": self.sink_slot,
            "bytes_per_block": self.bytes_per_block,
            "total_bytes": self.total_bytes,
        }


def plan_kv_pool(
    *,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    block_size: int,
    budget_bytes: int,
    max_blocks: int | None = None,
    forms: KvCacheDtype | None = None,
    layer_shapes: tuple[tuple[int, int], ...] = (),
) -> KVPoolPlan:
    """The largest pool whose blocks and sink slot fit budget_bytes (capped at max_blocks)."""
    require_positive(
        num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size
    )
    if max_blocks is not None:
        require_positive(max_blocks=max_blocks)
    unit = KVPoolPlan(num_layers, num_kv_heads, head_dim, dtype, block_size, 1, forms, layer_shapes)
    if budget_bytes < 0:
        raise GeometryError(f"budget_bytes must be >= 0, got {budget_bytes}")
    num_blocks = (budget_bytes - unit.bytes_per_slot) // unit.bytes_per_block
    if num_blocks < 1:
        raise PoolBudgetError(
            f"a K/V budget of {budget_bytes} bytes holds no block: one block of {block_size} slots"
            f" needs {unit.bytes_per_block} bytes plus {unit.bytes_per_slot} for the sink slot"
        )
    if max_blocks is not None:
        num_blocks = min(num_blocks, max_blocks)
    return KVPoolPlan(
        num_layers, num_kv_heads, head_dim, dtype, block_size, num_blocks, forms, layer_shapes
    )
