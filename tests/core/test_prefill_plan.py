"""plan_prefill: two chunks flattened into one batch, one of them after a cached prefix;
last_tokens: the same plan's queries cut to each chunk's last token."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nanoserve.core import (
    BlockTable,
    GeometryError,
    PrefillChunk,
    PrefillPlan,
    last_tokens,
    plan_prefill,
)

SINK = 16
S = SINK


def chunks() -> list[PrefillChunk]:
    return [
        # A fresh prompt of 3 tokens in block 2: slots 8, 9, 10.
        PrefillChunk(seq_id=1, token_ids=(10, 11, 12), start_pos=0, block_table=BlockTable(4, [2])),
        # Positions 0..4 are cached in blocks [3, 0]; this chunk is positions 5..7 (slots 1..3).
        PrefillChunk(
            seq_id=2, token_ids=(20, 21, 22), start_pos=5, block_table=BlockTable(4, [3, 0])
        ),
    ]


def test_two_chunks_exact() -> None:
    plan = plan_prefill(chunks(), sink_slot=SINK)
    assert isinstance(plan, PrefillPlan)
    assert plan.seq_ids == (1, 2)
    assert plan.num_tokens == 6
    assert plan.input_ids.tolist() == [10, 11, 12, 20, 21, 22]
    assert plan.positions.tolist() == [0, 1, 2, 5, 6, 7]
    assert plan.write_slots.tolist() == [8, 9, 10, 1, 2, 3]
    assert plan.query_starts == (0, 3, 6)
    assert plan.context_lens.tolist() == [3, 8]
    assert plan.slot_rect.tolist() == [
        [8, 9, 10, S, S, S, S, S],
        [12, 13, 14, 15, 0, 1, 2, 3],
    ]
    assert plan.last_token_idx.tolist() == [2, 5]
    assert plan.token_rows.tolist() == [0, 0, 0, 1, 1, 1]  # each token's row of slot_rect
    assert plan.token_context_lens.tolist() == [1, 2, 3, 6, 7, 8]  # causal: position + 1
    assert plan.sink_slot == SINK
    for name in (
        "input_ids",
        "positions",
        "write_slots",
        "context_lens",
        "slot_rect",
        "token_rows",
        "token_context_lens",
    ):
        assert getattr(plan, name).dtype == torch.int64


def test_a_single_token_chunk_is_a_decode_step() -> None:
    one = PrefillChunk(seq_id=3, token_ids=(30,), start_pos=6, block_table=BlockTable(4, [3, 0]))
    plan = plan_prefill([*chunks(), one], sink_slot=SINK)
    assert plan.query_starts == (0, 3, 6, 7)
    assert plan.positions.tolist()[-1] == 6
    assert plan.write_slots.tolist()[-1] == 2
    assert plan.context_lens.tolist() == [3, 8, 7]
    assert plan.slot_rect[2].tolist() == [12, 13, 14, 15, 0, 1, 2, S]
    assert plan.last_token_idx.tolist() == [2, 5, 6]


def test_last_tokens_keep_each_chunks_last_query_and_its_slots() -> None:
    one = PrefillChunk(seq_id=3, token_ids=(30,), start_pos=6, block_table=BlockTable(4, [3, 0]))
    plan = plan_prefill([*chunks(), one], sink_slot=SINK)
    last = last_tokens(plan)
    assert last.seq_ids == (1, 2, 3)
    assert last.num_tokens == 3
    assert last.input_ids.tolist() == [12, 22, 30]
    assert last.positions.tolist() == [2, 7, 6]
    assert last.write_slots.tolist() == [10, 3, 2]
    assert last.query_starts == (0, 1, 2, 3)  # one query a chunk, the last of its context
    assert last.context_lens.tolist() == [3, 8, 7]
    assert last.slot_rect is plan.slot_rect
    assert last.last_token_idx.tolist() == [0, 1, 2]
    assert last.token_rows.tolist() == [0, 1, 2]
    assert last.token_context_lens.tolist() == [3, 8, 7]  # what those tokens saw in the plan
    assert last.sink_slot == SINK
    assert last_tokens(last).input_ids.tolist() == [12, 22, 30]  # idempotent


def test_last_tokens_count_chunks_of_a_plan_that_names_no_sequence() -> None:
    # The boot's timing plans (engine/timing/step_timing.py) write the sink and name no sequence.
    anonymous = dataclasses.replace(plan_prefill(chunks(), sink_slot=SINK), seq_ids=())
    last = last_tokens(anonymous)
    assert last.query_starts == (0, 1, 2)
    assert last.input_ids.tolist() == [12, 22]


def test_needs_a_chunk() -> None:
    with pytest.raises(GeometryError, match=r"^plan_prefill needs at least one chunk$"):
        plan_prefill([], sink_slot=SINK)


def test_refuses_an_empty_chunk() -> None:
    empty = PrefillChunk(seq_id=4, token_ids=(), start_pos=0, block_table=BlockTable(4, [1]))
    with pytest.raises(GeometryError, match=r"^sequence 4 has an empty chunk$"):
        plan_prefill([chunks()[0], empty], sink_slot=SINK)


def test_refuses_a_negative_start() -> None:
    bad = PrefillChunk(seq_id=4, token_ids=(1,), start_pos=-1, block_table=BlockTable(4, [1]))
    with pytest.raises(GeometryError, match=r"^sequence 4 starts at position -1$"):
        plan_prefill([bad], sink_slot=SINK)


def test_refuses_a_chunk_past_its_blocks() -> None:
    long = PrefillChunk(
        seq_id=2, token_ids=(20, 21, 22, 23), start_pos=5, block_table=BlockTable(4, [3, 0])
    )
    with pytest.raises(GeometryError, match=r"^sequence 2 reaches position 8; its blocks hold 8$"):
        plan_prefill([long], sink_slot=SINK)


def test_each_chunk_carries_its_state_slot() -> None:
    with_state = [
        dataclasses.replace(c, state_slot=slot) for c, slot in zip(chunks(), (1, 0), strict=True)
    ]
    plan = plan_prefill(with_state, sink_slot=SINK, sink_state_slot=2)
    assert (plan.state_slots.tolist(), plan.sink_state_slot) == ([1, 0], 2)
    assert last_tokens(plan).state_slots.tolist() == [1, 0]  # the chunks', not the tokens'
