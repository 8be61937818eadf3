"""KvCacheDtype: the forms `--kv-cache-dtype` names, their bytes, and the pool plan they make."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.core import GeometryError, plan_kv_pool
from nanoserve.core.kv_cache_dtype import (
    BLOCK_BYTES,
    KvCacheDtype,
    KvCacheDtypeError,
    form_bytes,
    parse_kv_cache_dtype,
)


def test_parsing() -> None:
    assert parse_kv_cache_dtype("auto", torch.float16) == KvCacheDtype("float16", "float16")
    assert parse_kv_cache_dtype("", torch.bfloat16) == KvCacheDtype("bfloat16", "bfloat16")
    assert parse_kv_cache_dtype("Q8_0", torch.float16) == KvCacheDtype("q8_0", "q8_0")
    pair = parse_kv_cache_dtype("k=q8_0, v=q4_0", torch.float16)
    assert pair == KvCacheDtype("q8_0", "q4_0") and str(pair) == "k=q8_0,v=q4_0"
    assert pair.kernel_types == (3, 4) and KvCacheDtype.of(torch.float32).kernel_types == ()
    for bad, says in [
        ("k=q8_0", "name both k= and v="),
        ("k=q8_0,k=q4_0", "expected auto"),
        ("x=q8_0,v=q8_0", "expected auto"),
        ("q5_1", "'q5_1' is not a K/V form"),
        ("k=float16,v=bfloat16", "share one float form"),
    ]:
        with pytest.raises(KvCacheDtypeError, match=says):
            parse_kv_cache_dtype(bad, torch.float16)


def test_row_bytes_by_form() -> None:
    assert [form_bytes(f, 64) for f in ("float32", "bfloat16", "q8_0", "q4_0")] == [
        256,
        128,
        68,
        36,
    ]
    assert KvCacheDtype("q8_0", "q4_0").row_bytes(128) == 4 * 34 + 4 * 18
    with pytest.raises(KvCacheDtypeError, match="head_dim 48 is not a multiple of 32"):
        form_bytes("q4_0", 48)


@given(
    blocks=st.integers(1, 8),
    k=st.sampled_from(sorted(BLOCK_BYTES)),
    v=st.sampled_from(sorted(BLOCK_BYTES)),
)
def test_a_block_row_is_its_blocks(blocks: int, k: str, v: str) -> None:
    kv = KvCacheDtype(k, v)
    assert kv.row_bytes(32 * blocks) == blocks * (BLOCK_BYTES[k] + BLOCK_BYTES[v])
    assert kv.torch_dtype == torch.uint8 and kv.blocks


def test_the_plan_counts_the_smaller_slots() -> None:
    """30 layers of 2 K/V heads of 64, 16-slot blocks, 64 MiB: float16 slots are 30 * 2 * 256 = 15,360 bytes, q8_0's 8,160, q4_0's 4,320."""
    budget = 64 << 20

    def plan(kv: KvCacheDtype) -> tuple[int, int]:
        p = plan_kv_pool(num_layers=30, num_kv_heads=2, head_dim=64, dtype=kv.torch_dtype,
                         block_size=16, budget_bytes=budget, forms=kv)  # fmt: skip
        return p.bytes_per_slot, p.num_blocks

    assert plan(KvCacheDtype.of(torch.float16)) == (15_360, 273)  # (2^26 - 15,360) // 245,760
    assert plan(KvCacheDtype("q8_0", "q8_0")) == (8_160, 513)
    assert plan(KvCacheDtype("q4_0", "q4_0")) == (4_320, 970)
    assert plan(KvCacheDtype("q8_0", "q4_0")) == (6_240, 672)


def test_a_block_plan_must_store_bytes() -> None:
    with pytest.raises(GeometryError, match=r"a q8_0 pool stores torch\.uint8"):
        plan_kv_pool(num_layers=1, num_kv_heads=1, head_dim=32, dtype=torch.float16,
                     block_size=16, budget_bytes=1 << 20, forms=KvCacheDtype("q8_0", "q8_0"))  # fmt: skip
