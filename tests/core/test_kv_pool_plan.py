"""plan_kv_pool: exact sizing of a small pool, the sink slot inside the budget, and refusals."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nanoserve.core import GeometryError, KVPoolPlan, PoolBudgetError, plan_kv_pool

# 2 layers x 2 KV heads x head_dim 4 x fp32, K and V: 128 bytes a slot, 512 a block of 4.
GEOMETRY: dict[str, Any] = {
    "num_layers": 2,
    "num_kv_heads": 2,
    "head_dim": 4,
    "dtype": torch.float32,
    "block_size": 4,
}


def plan(budget_bytes: int, max_blocks: int | None = None) -> KVPoolPlan:
    return plan_kv_pool(**GEOMETRY, budget_bytes=budget_bytes, max_blocks=max_blocks)


def test_small_budget_exact() -> None:
    pool = plan(2000)  # (2000 - 128) // 512 = 3
    assert (pool.bytes_per_slot, pool.bytes_per_block) == (128, 512)
    assert (pool.num_blocks, pool.num_slots, pool.sink_slot) == (3, 12, 12)
    assert pool.total_bytes == 13 * 128 == 1664
    assert pool.total_bytes <= 2000


def test_as_dict_reports_the_plan() -> None:
    assert plan(2000).as_dict() == {
        "num_layers": 2,
        "num_kv_heads": 2,
        "head_dim": 4,
        "dtype": "float32",
        "kv_cache_dtype": "float32",
        "block_size": 4,
        "num_blocks": 3,
        "num_slots": 12,
        "sink_slot": 12,
        "bytes_per_block": 512,
        "total_bytes": 1664,
    }


def test_sink_slot_is_counted_in_the_budget() -> None:
    # Three blocks alone need 1536 bytes; with the sink slot they need 1664.
    assert plan(1664).num_blocks == 3
    assert plan(1663).num_blocks == 2
    assert plan(1536).num_blocks == 2
    # One block needs 512 + 128.
    assert plan(640).num_blocks == 1


@pytest.mark.parametrize("budget", [0, 512, 639])
def test_no_block_fits(budget: int) -> None:
    with pytest.raises(
        PoolBudgetError,
        match=(
            rf"^a K/V budget of {budget} bytes holds no block: one block of 4 slots needs 512"
            r" bytes plus 128 for the sink slot$"
        ),
    ):
        plan(budget)


def test_half_precision_halves_the_bytes() -> None:
    pool = plan_kv_pool(**{**GEOMETRY, "dtype": torch.float16}, budget_bytes=2000)
    assert (pool.bytes_per_slot, pool.bytes_per_block) == (64, 256)
    assert pool.num_blocks == (2000 - 64) // 256 == 7
    assert pool.as_dict()["dtype"] == "float16"


def test_max_blocks_caps_the_pool() -> None:
    assert plan(2000, max_blocks=2).num_blocks == 2
    assert plan(2000, max_blocks=3).num_blocks == 3
    assert plan(2000, max_blocks=100).num_blocks == 3
    capped = plan(10**6, max_blocks=5)
    assert (capped.num_slots, capped.sink_slot, capped.total_bytes) == (20, 20, 21 * 128)


@pytest.mark.parametrize("name", ["num_layers", "num_kv_heads", "head_dim", "block_size"])
@pytest.mark.parametrize("value", [0, -1])
def test_zero_or_negative_geometry(name: str, value: int) -> None:
    with pytest.raises(GeometryError, match=rf"^{name} must be a positive integer, got {value}$"):
        plan_kv_pool(**{**GEOMETRY, name: value}, budget_bytes=2000)


@pytest.mark.parametrize("max_blocks", [0, -2])
def test_zero_or_negative_max_blocks(max_blocks: int) -> None:
    with pytest.raises(
        GeometryError, match=rf"max_blocks must be a positive integer, got {max_blocks}"
    ):
        plan(2000, max_blocks=max_blocks)


def test_negative_budget() -> None:
    with pytest.raises(GeometryError, match=r"^budget_bytes must be >= 0, got -1$"):
        plan(-1)


def test_plan_is_frozen() -> None:
    pool = plan(2000)
    with pytest.raises(AttributeError):
        pool.num_blocks = 4  # type: ignore[misc]
