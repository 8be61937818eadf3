"""Paged attention against a dense reference, garbage in unread slots, and batch invariance.

Geometry: 4 query heads over 2 K/V heads (GQA), head_dim 4, block_size 4, 6 blocks (24 slots,
sink 24), float32. The dense reference is plain causal softmax attention in float64 over the
same K/V, written here independently of nanoserve.core.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.core import (
    BlockTable,
    DecodeSeq,
    GeometryError,
    PrefillChunk,
    SlotTable,
    pad_decode,
    padding_plan,
    paged_decode_attention,
    paged_prefill_attention,
    plan_decode,
    plan_prefill,
)

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 4, 2, 4, 4
NUM_SLOTS = 24
SINK = NUM_SLOTS
SCALE = 1 / math.sqrt(HEAD_DIM)
LEN = 8  # every sequence's K/V are known for positions 0..7
# Blocks 0..4 are owned; block 5 (slots 20..23) is never handed out.
TABLES = {10: BlockTable(BLOCK, [3, 0]), 11: BlockTable(BLOCK, [1, 4]), 12: BlockTable(BLOCK, [2])}
TOL: dict[str, Any] = {"rtol": 1e-5, "atol": 1e-6}


def randn(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# Each sequence's dense K, V and queries for positions 0..7 (seq 12 only has 4 positions).
KV = {
    seq_id: (
        randn(LEN, KV_HEADS, HEAD_DIM, seed=seq_id),
        randn(LEN, KV_HEADS, HEAD_DIM, seed=99 - seq_id),
    )
    for seq_id in TABLES
}
QUERIES = {seq_id: randn(LEN, HEADS, HEAD_DIM, seed=1000 + seq_id) for seq_id in TABLES}


def pool(garbage: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V pools with every sequence's K/V written; unowned slots and the sink hold garbage."""
    k_pool = torch.full((NUM_SLOTS + 1, KV_HEADS, HEAD_DIM), garbage)
    v_pool = torch.full((NUM_SLOTS + 1, KV_HEADS, HEAD_DIM), garbage)
    for seq_id, table in TABLES.items():
        slots = table.slot_ids(min(LEN, table.capacity))
        k, v = KV[seq_id]
        k_pool[slots] = k[: len(slots)]
        v_pool[slots] = v[: len(slots)]
    return k_pool, v_pool


def dense_attention(
    q: torch.Tensor,  # [n, heads, head_dim]
    k: torch.Tensor,  # [context, kv_heads, head_dim]
    v: torch.Tensor,  # [context, kv_heads, head_dim]
    query_positions: list[int],
    window: int | None = None,
) -> torch.Tensor:  # [n, heads, head_dim] float64
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)  # query head h reads K/V head h // group
    v = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("nhd,chd->hnc", q.double(), k) * SCALE
    keys, queries = torch.arange(k.shape[0])[None, :], torch.tensor(query_positions)[:, None]
    causal = keys <= queries
    if window is not None:  # a query sees its last `window` positions, itself included
        causal &= keys > queries - window
    weights = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
    return torch.einsum("hnc,chd->nhd", weights, v)


def decode_seqs(positions: dict[int, int]) -> list[DecodeSeq]:
    return [DecodeSeq(s, 0, p, TABLES[s]) for s, p in positions.items()]


def decode_queries(positions: dict[int, int], pad: int = 0) -> torch.Tensor:
    real = [QUERIES[s][p] for s, p in positions.items()]
    return torch.stack(real + [randn(HEADS, HEAD_DIM, seed=7 + i) for i in range(pad)])


def decode_reference(positions: dict[int, int]) -> torch.Tensor:
    rows = []
    for s, p in positions.items():
        k, v = KV[s]
        rows.append(dense_attention(QUERIES[s][p : p + 1], k[: p + 1], v[: p + 1], [p])[0])
    return torch.stack(rows)


POSITIONS = {10: 5, 11: 2, 12: 3}  # contexts 6, 3, 4


def test_dense_reference_is_not_trivial() -> None:
    # Guards the reference itself: GQA grouping matters, and the causal mask matters.
    k, v = KV[10]
    q = QUERIES[10][:3]
    ref = dense_attention(q, k[:3], v[:3], [0, 1, 2])
    torch.testing.assert_close(ref[0], v[0].double().repeat_interleave(2, dim=0))
    swapped = dense_attention(q, k[:3].flip(1), v[:3].flip(1), [0, 1, 2])
    assert not torch.allclose(ref[1:], swapped[1:])


def test_decode_equals_dense_attention() -> None:
    k_pool, v_pool = pool()
    plan = plan_decode(decode_seqs(POSITIONS), sink_slot=SINK)
    out = paged_decode_attention(
        decode_queries(POSITIONS), k_pool, v_pool, plan.slot_rect, plan.context_lens, SCALE
    )
    assert out.shape == (3, HEADS, HEAD_DIM) and out.dtype == torch.float32
    torch.testing.assert_close(out, decode_reference(POSITIONS).float(), **TOL)


def test_decode_padded_rows_are_exact_zeros_and_real_rows_unchanged() -> None:
    k_pool, v_pool = pool(garbage=float("nan"))
    plan = pad_decode(plan_decode(decode_seqs(POSITIONS), sink_slot=SINK), 5, 12)
    out = paged_decode_attention(
        decode_queries(POSITIONS, pad=2), k_pool, v_pool, plan.slot_rect, plan.context_lens, SCALE
    )
    assert torch.equal(out[3:], torch.zeros(2, HEADS, HEAD_DIM))
    torch.testing.assert_close(out[:3], decode_reference(POSITIONS).float(), **TOL)


def test_warm_plan_gives_zeros_over_a_real_table_and_a_nan_sink() -> None:
    k_pool, v_pool = pool(garbage=float("nan"))
    table = SlotTable(4, 16, SINK)
    plan_decode(decode_seqs(POSITIONS), sink_slot=SINK, table=table)  # real rows in the table
    warm = padding_plan(4, 16, table=table)
    out = paged_decode_attention(
        randn(4, HEADS, HEAD_DIM, seed=3), k_pool, v_pool, warm.slot_rect, warm.context_lens, SCALE
    )
    assert torch.equal(out, torch.zeros(4, HEADS, HEAD_DIM))


@pytest.mark.parametrize("garbage", [float("nan"), float("inf"), float("-inf"), 1e30, -7.0])
def test_decode_ignores_garbage_in_unread_slots(garbage: float) -> None:
    plan = pad_decode(plan_decode(decode_seqs(POSITIONS), sink_slot=SINK), 4, 9)
    q = decode_queries(POSITIONS, pad=1)
    clean = paged_decode_attention(q, *pool(0.0), plan.slot_rect, plan.context_lens, SCALE)
    dirty = paged_decode_attention(q, *pool(garbage), plan.slot_rect, plan.context_lens, SCALE)
    assert torch.equal(dirty, clean)
    assert torch.isfinite(dirty).all()


def test_decode_ignores_real_slots_past_the_context() -> None:
    # A table row keeps a previous owner's slots past the new context: they are masked.
    k_pool, v_pool = pool()
    table = SlotTable(3, 8, SINK)
    plan_decode(decode_seqs({11: 7, 10: 7, 12: 3}), sink_slot=SINK, table=table)
    windowed = plan_decode(decode_seqs(POSITIONS), sink_slot=SINK, table=table)
    assert windowed.slot_rect[1, 3:].tolist() == [15, 0, 1]  # seq 10's slots in seq 11's row
    fresh = plan_decode(decode_seqs(POSITIONS), sink_slot=SINK)
    q = decode_queries(POSITIONS)
    assert torch.equal(
        paged_decode_attention(q, k_pool, v_pool, windowed.slot_rect, windowed.context_lens, SCALE),
        paged_decode_attention(q, k_pool, v_pool, fresh.slot_rect, fresh.context_lens, SCALE),
    )


@settings(max_examples=60, deadline=None)
@given(
    positions=st.dictionaries(st.sampled_from([10, 11]), st.integers(0, LEN - 1), min_size=1),
    extra_rows=st.integers(0, 3),
    extra_width=st.integers(0, 6),
)
def test_decode_matches_dense_for_any_positions_and_padding(
    positions: dict[int, int], extra_rows: int, extra_width: int
) -> None:
    plan = plan_decode(decode_seqs(positions), sink_slot=SINK)
    plan = pad_decode(plan, plan.num_rows + extra_rows, plan.width + extra_width)
    out = paged_decode_attention(
        decode_queries(positions, pad=extra_rows),
        *pool(float("nan")),
        plan.slot_rect,
        plan.context_lens,
        SCALE,
    )
    torch.testing.assert_close(out[: len(positions)], decode_reference(positions).float(), **TOL)
    assert torch.equal(out[len(positions) :], torch.zeros(extra_rows, HEADS, HEAD_DIM))


def prefill(chunks: list[PrefillChunk], q: torch.Tensor, **kwargs: Any) -> torch.Tensor:
    plan = plan_prefill(chunks, sink_slot=SINK)
    return paged_prefill_attention(
        q,
        *pool(float("nan")),
        plan.query_starts,
        plan.context_lens.tolist(),
        plan.slot_rect,
        SCALE,
        **kwargs,
    )


def full_causal(seq_id: int, length: int) -> torch.Tensor:
    k, v = KV[seq_id]
    return dense_attention(QUERIES[seq_id][:length], k[:length], v[:length], list(range(length)))


@pytest.mark.parametrize("window", [1, 3, 8])
def test_a_sliding_window_equals_dense_attention_within_it(window: int) -> None:
    """Decode rows and a prompt chunk over a cached prefix, each position seeing its last
    `window` positions (a window of 1: itself alone, so its own V)."""
    k_pool, v_pool = pool(float("nan"))
    plan = plan_decode(decode_seqs(POSITIONS), sink_slot=SINK)
    out = paged_decode_attention(
        decode_queries(POSITIONS), k_pool, v_pool, plan.slot_rect, plan.context_lens, SCALE,
        window=window,
    )  # fmt: skip
    for row, (s, p) in enumerate(POSITIONS.items()):
        k, v = KV[s]
        expected = dense_attention(QUERIES[s][p : p + 1], k[: p + 1], v[: p + 1], [p], window)
        torch.testing.assert_close(out[row], expected[0].float(), **TOL)
    chunk = PrefillChunk(10, (0, 0, 0), 5, TABLES[10])
    prefill_plan = plan_prefill([chunk], sink_slot=SINK)
    out = paged_prefill_attention(
        QUERIES[10][5:8], k_pool, v_pool, prefill_plan.query_starts,
        prefill_plan.context_lens.tolist(), prefill_plan.slot_rect, SCALE, window=window,
    )  # fmt: skip
    k, v = KV[10]
    expected = dense_attention(QUERIES[10][5:8], k, v, [5, 6, 7], window)
    torch.testing.assert_close(out, expected.float(), **TOL)
    if window == 1:
        torch.testing.assert_close(out[:, 0], v[5:8, 0], **TOL)


def test_prefill_of_a_whole_prompt_equals_causal_attention() -> None:
    out = prefill([PrefillChunk(10, (0,) * LEN, 0, TABLES[10])], QUERIES[10])
    assert out.shape == (LEN, HEADS, HEAD_DIM) and out.dtype == torch.float32
    torch.testing.assert_close(out, full_causal(10, LEN).float(), **TOL)


def test_prefill_with_cached_prefix_equals_rows_of_full_attention() -> None:
    # seq 10: positions 0..4 cached, chunk 5..7; seq 11: a fresh 3-token prompt.
    chunks = [
        PrefillChunk(10, (0, 0, 0), 5, TABLES[10]),
        PrefillChunk(11, (0, 0, 0), 0, TABLES[11]),
    ]
    q = torch.cat([QUERIES[10][5:8], QUERIES[11][0:3]])
    out = prefill(chunks, q)
    torch.testing.assert_close(out[:3], full_causal(10, LEN)[5:8].float(), **TOL)
    torch.testing.assert_close(out[3:], full_causal(11, 3).float(), **TOL)


def test_prefill_last_row_equals_decode_of_that_position() -> None:
    chunk = PrefillChunk(11, (0, 0), 6, TABLES[11])
    out = prefill([chunk], QUERIES[11][6:8])
    decode = paged_decode_attention(
        QUERIES[11][7:8],
        *pool(float("nan")),
        plan_decode(decode_seqs({11: 7}), sink_slot=SINK).slot_rect,
        torch.tensor([8]),
        SCALE,
    )
    torch.testing.assert_close(out[1:], decode, **TOL)


# --- float64 accumulation: a row's bits do not depend on its rectangle or its batch -----------


def test_float64_decode_is_invariant_to_width_and_batch() -> None:
    k_pool, v_pool = pool(float("nan"))
    base = plan_decode(decode_seqs(POSITIONS), sink_slot=SINK)  # (3, 6)

    def run(positions: dict[int, int], num_rows: int, width: int) -> torch.Tensor:
        plan = pad_decode(plan_decode(decode_seqs(positions), sink_slot=SINK), num_rows, width)
        q = decode_queries(positions, pad=num_rows - len(positions))
        out = paged_decode_attention(
            q, k_pool, v_pool, plan.slot_rect, plan.context_lens, SCALE, torch.float64
        )
        assert out.dtype == torch.float64
        return out.float()

    narrow = run(POSITIONS, 3, 8)
    wide = run(POSITIONS, 3, 40)
    big_batch = run(POSITIONS, 16, 40)
    alone = run({11: 2}, 1, base.width)
    reordered = run({12: 3, 10: 5}, 2, 8)
    assert torch.equal(narrow, wide)
    assert torch.equal(narrow, big_batch[:3])
    assert torch.equal(narrow[1], alone[0])
    assert torch.equal(narrow[2], reordered[0])
    assert torch.equal(narrow[0], reordered[1])
    torch.testing.assert_close(narrow, decode_reference(POSITIONS).float(), **TOL)


def test_float64_prefill_is_invariant_to_width_and_batch() -> None:
    chunk = PrefillChunk(10, (0, 0, 0), 5, TABLES[10])
    other = PrefillChunk(11, (0,) * 6, 0, TABLES[11])
    alone = prefill([chunk], QUERIES[10][5:8], accum_dtype=torch.float64).float()
    batched = prefill(
        [other, chunk], torch.cat([QUERIES[11][:6], QUERIES[10][5:8]]), accum_dtype=torch.float64
    ).float()
    plan = plan_prefill([chunk], sink_slot=SINK)
    wide_rect = torch.full((1, 40), SINK)
    wide_rect[:, : plan.slot_rect.shape[1]] = plan.slot_rect
    wide = paged_prefill_attention(
        QUERIES[10][5:8],
        *pool(float("nan")),
        plan.query_starts,
        plan.context_lens.tolist(),
        wide_rect,
        SCALE,
        torch.float64,
    ).float()
    assert torch.equal(alone, batched[6:])
    assert torch.equal(alone, wide)
    torch.testing.assert_close(alone, full_causal(10, LEN)[5:8].float(), **TOL)


# --- errors -----------------------------------------------------------------------------------


def test_heads_must_group_over_kv_heads() -> None:
    k_pool, v_pool = pool()
    plan = plan_decode(decode_seqs({10: 1}), sink_slot=SINK)
    with pytest.raises(GeometryError, match=r"^3 query heads do not group over 2 K/V heads$"):
        paged_decode_attention(
            randn(1, 3, HEAD_DIM, seed=0), k_pool, v_pool, plan.slot_rect, plan.context_lens, SCALE
        )
    with pytest.raises(GeometryError, match=r"^3 query heads do not group over 2 K/V heads$"):
        paged_prefill_attention(
            randn(2, 3, HEAD_DIM, seed=0), k_pool, v_pool, (0, 2), [2], plan.slot_rect, SCALE
        )


def test_decode_rows_must_agree() -> None:
    k_pool, v_pool = pool()
    plan = plan_decode(decode_seqs({10: 1, 11: 1}), sink_slot=SINK)
    with pytest.raises(GeometryError, match=r"^q has 3 rows, slot_rect 2, context_lens 2$"):
        paged_decode_attention(
            randn(3, HEADS, HEAD_DIM, seed=0),
            k_pool,
            v_pool,
            plan.slot_rect,
            plan.context_lens,
            SCALE,
        )


def test_prefill_query_starts_must_cut_the_tokens() -> None:
    k_pool, v_pool = pool()
    rect = torch.zeros((1, 8), dtype=torch.int64)
    q = randn(6, HEADS, HEAD_DIM, seed=0)
    with pytest.raises(
        GeometryError, match=r"^query_starts \(0, 3\) do not cut 6 tokens into 1 chunks$"
    ):
        paged_prefill_attention(q, k_pool, v_pool, (0, 3), [3], rect, SCALE)
    with pytest.raises(
        GeometryError, match=r"^query_starts \(0, 6\) do not cut 6 tokens into 2 chunks$"
    ):
        paged_prefill_attention(q, k_pool, v_pool, (0, 6), [3, 3], rect, SCALE)


@pytest.mark.parametrize(
    ("context_len", "width", "message"),
    [
        (2, 8, r"^chunk 0: 3 new tokens, context 2, rectangle width 8$"),
        (9, 8, r"^chunk 0: 3 new tokens, context 9, rectangle width 8$"),
    ],
)
def test_prefill_chunk_must_fit_its_context(context_len: int, width: int, message: str) -> None:
    k_pool, v_pool = pool()
    rect = torch.zeros((1, width), dtype=torch.int64)
    with pytest.raises(GeometryError, match=message):
        paged_prefill_attention(
            randn(3, HEADS, HEAD_DIM, seed=0), k_pool, v_pool, (0, 3), [context_len], rect, SCALE
        )
