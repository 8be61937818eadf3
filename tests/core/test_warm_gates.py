"""Warm-up gates: each passes on a correct warm-up and fails, quoting numbers, on a wrong one."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from nanoserve.core import (
    BlockTable,
    BucketSet,
    DecodeBuffers,
    DecodePlan,
    DecodeSeq,
    GateError,
    Shape,
    SlotTable,
    bucket_decode,
    padding_plan,
    paged_decode_attention,
    plan_decode,
    warm_shapes,
)
from nanoserve.core.step_footprint import StepFootprint
from nanoserve.core.warm_gates import (
    ColdCaptureError,
    NotAllWarmError,
    TableMovedError,
    WarmBudgetError,
    WarmGraphBoundError,
    WarmRowsNotEmptyError,
    WarmTouchedPoolError,
    WarmWriteNotSinkError,
    check_all_warm,
    check_no_cold_captures,
    check_table_stable,
    check_warm_budget,
    check_warm_graphs_unbound,
    check_warm_rows_empty,
    check_warm_touches_nothing,
    check_warm_writes_sink,
)

NUM_SLOTS = 16
SINK = NUM_SLOTS
KV_HEADS, HEAD_DIM = 2, 2


def vec(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@pytest.fixture
def table() -> SlotTable:
    return SlotTable(4, 8, SINK)


@pytest.fixture
def real_plan(table: SlotTable) -> DecodePlan:
    seqs = [
        DecodeSeq(10, 100, 5, BlockTable(4, [3, 0])),
        DecodeSeq(11, 101, 2, BlockTable(4, [1])),
        DecodeSeq(12, 102, 0, BlockTable(4, [2])),
    ]
    return bucket_decode(plan_decode(seqs, sink_slot=SINK, table=table), BucketSet(4, 8, 4), table)


@pytest.fixture
def warm(table: SlotTable, real_plan: DecodePlan) -> DecodePlan:
    return padding_plan(4, 8, table=table)


def test_every_warm_gate_error_is_a_gate_error() -> None:
    for error in (
        WarmRowsNotEmptyError,
        WarmWriteNotSinkError,
        WarmTouchedPoolError,
        TableMovedError,
        WarmGraphBoundError,
        ColdCaptureError,
        NotAllWarmError,
        WarmBudgetError,
    ):
        assert issubclass(error, GateError)


# --- check_warm_rows_empty ---------------------------------------------------------------------


def test_warm_rows_empty(warm: DecodePlan, real_plan: DecodePlan) -> None:
    check_warm_rows_empty(warm)
    with pytest.raises(
        WarmRowsNotEmptyError,
        match=r"^a warm batch must have no rows; this one has \(10, 11, 12\)$",
    ):
        check_warm_rows_empty(real_plan)


# --- check_warm_writes_sink --------------------------------------------------------------------


def test_warm_writes_sink_passes(warm: DecodePlan) -> None:
    check_warm_writes_sink(warm)


def test_warm_writes_sink_fails_on_a_real_write(warm: DecodePlan) -> None:
    with pytest.raises(
        WarmWriteNotSinkError,
        match=r"^warm row 1 writes slot 5 with context_len 0; it must write the sink 16 with 0$",
    ):
        check_warm_writes_sink(replace(warm, write_slots=vec(SINK, 5, SINK, SINK)))


def test_warm_writes_sink_fails_on_an_unmasked_row(warm: DecodePlan) -> None:
    with pytest.raises(
        WarmWriteNotSinkError, match=r"^warm row 2 writes slot 16 with context_len 3;"
    ):
        check_warm_writes_sink(replace(warm, context_lens=vec(0, 0, 3, 0)))


def test_warm_writes_sink_fails_on_a_real_state_slot(warm: DecodePlan) -> None:
    wrong = replace(warm, state_slots=vec(0, 0, 1, 0), sink_state_slot=0)
    with pytest.raises(
        WarmWriteNotSinkError,
        match=r"^warm row 2 uses state slot 1; it must use the sink state slot 0$",
    ):
        check_warm_writes_sink(wrong)


def test_warm_writes_sink_fails_on_a_real_plan(real_plan: DecodePlan) -> None:
    with pytest.raises(
        WarmWriteNotSinkError, match=r"^warm row 0 writes slot 1 with context_len 6"
    ):
        check_warm_writes_sink(real_plan)


# --- check_warm_touches_nothing ----------------------------------------------------------------


def pools() -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(NUM_SLOTS + 1, KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2)]


def step(plan: DecodePlan, k_pool: torch.Tensor, v_pool: torch.Tensor) -> torch.Tensor:
    """What a decode step does to the pool: one index_put of every row's K/V, then attention."""
    rows = plan.num_rows
    k_pool.index_put_((plan.write_slots,), torch.full((rows, KV_HEADS, HEAD_DIM), 7.0))
    v_pool.index_put_((plan.write_slots,), torch.full((rows, KV_HEADS, HEAD_DIM), -7.0))
    q = torch.ones(rows, 4, HEAD_DIM)
    return paged_decode_attention(q, k_pool, v_pool, plan.slot_rect, plan.context_lens, 0.5)


def test_a_warm_step_touches_nothing(warm: DecodePlan) -> None:
    k_pool, v_pool = pools()
    before = [k_pool.clone(), v_pool.clone()]
    loaded = DecodeBuffers.allocate(4, SINK).load(warm)  # the addressing in the real buffers
    out = step(loaded, k_pool, v_pool)
    assert torch.equal(out, torch.zeros_like(out))
    assert k_pool[SINK].eq(7.0).all()  # the sink did change
    check_warm_touches_nothing(before, [k_pool, v_pool], NUM_SLOTS)


def test_a_real_step_fails_the_warm_pool_gate(real_plan: DecodePlan) -> None:
    k_pool, v_pool = pools()
    before = [k_pool.clone(), v_pool.clone()]
    step(real_plan, k_pool, v_pool)  # writes slots 1, 6, 8 and the sink
    with pytest.raises(
        WarmTouchedPoolError, match=r"^pool 0: real slot 1 of 16 changed during the warm-up$"
    ):
        check_warm_touches_nothing(before, [k_pool, v_pool], NUM_SLOTS)


def test_changing_only_the_sink_passes() -> None:
    before = pools()
    after = [p.clone() for p in before]
    after[1][SINK] = float("nan")
    check_warm_touches_nothing(before, after, NUM_SLOTS)


def test_changing_one_real_slot_fails_and_names_it() -> None:
    before = pools()
    after = [p.clone() for p in before]
    after[1][NUM_SLOTS - 1, 1, 0] += 1.0
    with pytest.raises(
        WarmTouchedPoolError, match=r"^pool 1: real slot 15 of 16 changed during the warm-up$"
    ):
        check_warm_touches_nothing(before, after, NUM_SLOTS)


def test_an_unchanged_nan_slot_is_not_named() -> None:
    # Uninitialised pools hold NaN; NaN != NaN must not be reported as the change.
    before = pools()
    before[0][2] = float("nan")
    after = [p.clone() for p in before]
    check_warm_touches_nothing(before, after, NUM_SLOTS)
    after[0][9, 0, 1] = 3.0
    with pytest.raises(WarmTouchedPoolError, match=r"^pool 0: real slot 9 of 16 changed"):
        check_warm_touches_nothing(before, after, NUM_SLOTS)


def test_a_byte_change_equal_in_value_is_named() -> None:
    before = [torch.zeros(NUM_SLOTS + 1, KV_HEADS, HEAD_DIM)]
    after = [before[0].clone()]
    after[0][4, 0, 0] = -0.0  # == 0.0, but not the same bits
    with pytest.raises(WarmTouchedPoolError, match=r"^pool 0: real slot 4 of 16 changed"):
        check_warm_touches_nothing(before, after, NUM_SLOTS)


def test_pool_count_must_match() -> None:
    before = pools()
    with pytest.raises(WarmTouchedPoolError, match=r"^2 pools before the warm-up, 1 after$"):
        check_warm_touches_nothing(before, before[:1], NUM_SLOTS)


def test_pool_shape_must_match() -> None:
    before = pools()
    after = [before[0].clone(), before[1][:, :1].clone()]
    with pytest.raises(
        WarmTouchedPoolError,
        match=r"^pool 1: \(17, 2, 2\) torch.float32 before the warm-up, \(17, 1, 2\) torch.float32 after$",
    ):
        check_warm_touches_nothing(before, after, NUM_SLOTS)


# --- check_table_stable ------------------------------------------------------------------------


def test_table_stable(table: SlotTable, warm: DecodePlan) -> None:
    address = table.address
    padding_plan(2, 4, table=table)
    check_table_stable(address, table.address)
    moved = table.to("cpu")
    with pytest.raises(
        TableMovedError,
        match=rf"^the slot table moved from {address:#x} to {moved.address:#x}$",
    ):
        check_table_stable(address, moved.address)


# --- check_warm_graphs_unbound, check_no_cold_captures, check_all_warm --------------------------


def test_warm_graphs_unbound() -> None:
    check_warm_graphs_unbound({})
    check_warm_graphs_unbound({Shape(4, 8): (), Shape(2, 8): ()})
    with pytest.raises(
        WarmGraphBoundError,
        match=r"^the recording of Shape\(rows=2, width=8\) is bound to rows \(10, 11\)$",
    ):
        check_warm_graphs_unbound({Shape(4, 8): (), Shape(2, 8): (10, 11)})


def test_no_cold_captures() -> None:
    check_no_cold_captures(0)
    with pytest.raises(ColdCaptureError, match=r"^3 recordings were made in front of clients$"):
        check_no_cold_captures(3)


def test_all_warm() -> None:
    warm_list = warm_shapes(BucketSet(4, 8, 4))
    assert warm_list == (
        Shape(4, 8),
        Shape(4, 4),
        Shape(2, 8),
        Shape(2, 4),
        Shape(1, 8),
        Shape(1, 4),
    )
    check_all_warm(warm_list, warm_list)
    check_all_warm(warm_list[2:], warm_list)  # extra recordings are fine
    check_all_warm((), ())
    with pytest.raises(
        NotAllWarmError,
        match=(
            r"^2 shapes have no recording, first"
            r" \[Shape\(rows=4, width=8\), Shape\(rows=1, width=4\)\]$"
        ),
    ):
        check_all_warm(warm_list, warm_list[1:-1])


# --- check_warm_budget -------------------------------------------------------------------------


# 2 heads, 1 K/V head of 4, vocab 8, fp32: attention holds 73 bytes per (row, position) and
# the logits 64 per row, so (4, 8) peaks at 2336 bytes, (2, 32) at 4672 and (1, 4) at 292.
TINY = StepFootprint(
    num_heads=2, num_kv_heads=1, head_dim=4, vocab_size=8, pool_bytes=4, accum_bytes=4
)


def test_warm_budget_small() -> None:
    shapes = [Shape(4, 8), Shape(2, 32), Shape(1, 4)]
    check_warm_budget(shapes, TINY, 4672)
    check_warm_budget([], TINY, 0)
    with pytest.raises(
        WarmBudgetError,
        match=r"^shape Shape\(rows=2, width=32\) needs 4672 bytes at its peak; the budget is 4671$",
    ):
        check_warm_budget(shapes, TINY, 4671)


def test_warm_budget_passes_the_list_its_width_ceiling_trimmed() -> None:
    # SmolLM2-135M's geometry in bf16, accumulating in fp32.
    footprint = StepFootprint(
        num_heads=9, num_kv_heads=3, head_dim=64, vocab_size=49152, pool_bytes=2, accum_bytes=4
    )
    buckets = BucketSet(32, 4096, 64)
    budget = 64_000_000
    ceiling = footprint.width_ceiling(budget, 32)
    trimmed = warm_shapes(buckets, max_width=ceiling)
    check_warm_budget(trimmed, footprint, budget)
    needed = footprint.peak_bytes(32, 4096)
    with pytest.raises(
        WarmBudgetError,
        match=rf"^shape Shape\(rows=32, width=4096\) needs {needed} bytes at its peak;",
    ):
        check_warm_budget(warm_shapes(buckets), footprint, budget)
