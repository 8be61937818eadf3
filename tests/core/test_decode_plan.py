"""plan_decode, pad_decode and padding_plan: exact tensors on block_size 4, sink 16."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nanoserve.core import (
    BlockTable,
    DecodePlan,
    DecodeSeq,
    GeometryError,
    SlotTable,
    pad_decode,
    padding_plan,
    plan_decode,
)

SINK = 16  # 4 blocks of 4 slots


def seqs() -> list[DecodeSeq]:
    # seq 10: blocks [3, 0], feeding position 5 (slot 1); seq 11: block [1], position 2 (slot 6).
    return [
        DecodeSeq(seq_id=10, token_id=100, position=5, block_table=BlockTable(4, [3, 0])),
        DecodeSeq(seq_id=11, token_id=101, position=2, block_table=BlockTable(4, [1])),
    ]


def rows_of(plan: DecodePlan) -> dict[str, list]:
    return {
        "input_ids": plan.input_ids.tolist(),
        "positions": plan.positions.tolist(),
        "write_slots": plan.write_slots.tolist(),
        "context_lens": plan.context_lens.tolist(),
        "slot_rect": plan.slot_rect.tolist(),
    }


S = SINK
EXPECTED = {
    "input_ids": [100, 101],
    "positions": [5, 2],
    "write_slots": [1, 6],
    "context_lens": [6, 3],
    "slot_rect": [[12, 13, 14, 15, 0, 1], [4, 5, 6, S, S, S]],
}


def test_plan_decode_without_table() -> None:
    plan = plan_decode(seqs(), sink_slot=SINK)
    assert plan.seq_ids == (10, 11)
    assert (plan.pad_rows, plan.num_rows, plan.width, plan.shape) == (0, 2, 6, (2, 6))
    assert plan.sink_slot == SINK
    assert rows_of(plan) == EXPECTED
    for name in ("input_ids", "positions", "write_slots", "context_lens", "slot_rect"):
        assert getattr(plan, name).dtype == torch.int64


def test_plan_decode_with_table_is_a_window() -> None:
    table = SlotTable(4, 8, SINK)
    plan = plan_decode(seqs(), sink_slot=SINK, table=table)
    assert plan.seq_ids == (10, 11)
    assert rows_of(plan) == EXPECTED
    assert plan.slot_rect.data_ptr() == table.address
    assert plan.slot_rect.stride() == table.tensor.stride()
    assert table.row_owners == (10, 11, None, None)
    assert [table.written_len(r) for r in range(4)] == [6, 3, 0, 0]
    # The next step of seq 10 rewrites only its new position; a new owner rewrites row 1.
    step = [
        DecodeSeq(10, 102, 6, BlockTable(4, [3, 0])),
        DecodeSeq(12, 103, 1, BlockTable(4, [2])),
    ]
    plan = plan_decode(step, sink_slot=SINK, table=table)
    assert plan.seq_ids == (10, 12)
    assert plan.context_lens.tolist() == [7, 2]
    assert plan.write_slots.tolist() == [2, 9]
    assert plan.slot_rect.tolist() == [
        [12, 13, 14, 15, 0, 1, 2],
        [8, 9, 6, S, S, S, S],  # position 2 still names seq 11's slot: masked by context 2
    ]
    assert table.row_owners == (10, 12, None, None)


def test_plan_decode_single_first_token() -> None:
    plan = plan_decode([DecodeSeq(5, 7, 0, BlockTable(4, [2]))], sink_slot=SINK)
    assert rows_of(plan) == {
        "input_ids": [7],
        "positions": [0],
        "write_slots": [8],
        "context_lens": [1],
        "slot_rect": [[8]],
    }


def test_plan_decode_needs_a_sequence() -> None:
    with pytest.raises(GeometryError, match=r"plan_decode needs at least one sequence"):
        plan_decode([], sink_slot=SINK)


def test_plan_decode_refuses_more_rows_than_the_table() -> None:
    with pytest.raises(GeometryError, match=r"^2 rows exceed max_batch 1$"):
        plan_decode(seqs(), sink_slot=SINK, table=SlotTable(1, 8, SINK))


def test_plan_decode_refuses_a_position_beyond_the_blocks() -> None:
    late = DecodeSeq(10, 100, 8, BlockTable(4, [3, 0]))
    with pytest.raises(GeometryError, match=r"^position 8 is outside this table's 8 slots$"):
        plan_decode([late], sink_slot=SINK)


def test_plan_decode_refuses_a_position_beyond_the_table() -> None:
    with pytest.raises(GeometryError, match=r"^sequence 10 has 6 positions; the table holds 4$"):
        plan_decode(seqs(), sink_slot=SINK, table=SlotTable(4, 4, SINK))


def test_pad_decode_without_table() -> None:
    plan = plan_decode(seqs(), sink_slot=SINK)
    padded = pad_decode(plan, 4, 8)
    assert padded.seq_ids == (10, 11)
    assert (padded.pad_rows, padded.shape) == (2, (4, 8))
    assert rows_of(padded) == {
        "input_ids": [100, 101, 0, 0],
        "positions": [5, 2, 0, 0],
        "write_slots": [1, 6, S, S],
        "context_lens": [6, 3, 0, 0],
        "slot_rect": [
            [12, 13, 14, 15, 0, 1, S, S],
            [4, 5, 6, S, S, S, S, S],
            [S] * 8,
            [S] * 8,
        ],
    }
    assert rows_of(plan) == EXPECTED  # derived, not mutated


def test_pad_decode_with_table_is_a_window() -> None:
    table = SlotTable(4, 8, SINK)
    plan = plan_decode(seqs(), sink_slot=SINK, table=table)
    padded = pad_decode(plan, 3, 7, table)
    assert (padded.pad_rows, padded.shape) == (1, (3, 7))
    assert padded.slot_rect.data_ptr() == table.address
    assert padded.slot_rect.tolist() == [
        [12, 13, 14, 15, 0, 1, S],  # position 6 of row 0 is unwritten: the sink
        [4, 5, 6, S, S, S, S],
        [S] * 7,
    ]
    assert padded.write_slots.tolist() == [1, 6, S]
    assert padded.context_lens.tolist() == [6, 3, 0]


def test_pad_decode_same_shape_is_legal() -> None:
    plan = plan_decode(seqs(), sink_slot=SINK)
    same = pad_decode(plan, 2, 6)
    assert rows_of(same) == EXPECTED
    assert same.pad_rows == 0


@pytest.mark.parametrize(("num_rows", "width"), [(1, 6), (2, 5)])
def test_pad_decode_cannot_shrink(num_rows: int, width: int) -> None:
    plan = plan_decode(seqs(), sink_slot=SINK)
    with pytest.raises(
        GeometryError, match=rf"^cannot pad a \(2, 6\) plan down to \({num_rows}, {width}\)$"
    ):
        pad_decode(plan, num_rows, width)


def test_warmup_plan_is_all_padding_on_the_real_table() -> None:
    table = SlotTable(4, 8, SINK)
    plan_decode(seqs(), sink_slot=SINK, table=table)  # the table holds real rows
    warm = padding_plan(3, 4, table=table)
    assert warm.seq_ids == ()
    assert (warm.pad_rows, warm.num_rows, warm.shape, warm.sink_slot) == (3, 3, (3, 4), SINK)
    assert warm.input_ids.tolist() == [0, 0, 0]
    assert warm.positions.tolist() == [0, 0, 0]
    assert warm.write_slots.tolist() == [S, S, S]
    assert warm.context_lens.tolist() == [0, 0, 0]
    # A window on the real table: it shows the real rows' addresses, and it is their storage.
    assert warm.slot_rect.data_ptr() == table.address
    assert warm.slot_rect.stride() == table.tensor.stride()
    assert warm.slot_rect.tolist() == [[12, 13, 14, 15], [4, 5, 6, S], [S, S, S, S]]
    table.write_row(2, 12, torch.tensor([8]))
    assert warm.slot_rect[2, 0].item() == 8


@pytest.mark.parametrize(
    ("num_rows", "width", "message"),
    [
        (0, 4, r"a plan with no rows must pad at least one row"),
        (-1, 4, r"cannot pad a \(0, 0\) plan down to \(-1, 4\)"),
        (5, 4, r"5 rows exceed the table's max_batch 4"),
        (2, 0, r"width 0 is outside 1\.\.8"),
        (2, 9, r"width 9 is outside 1\.\.8"),
    ],
)
def test_warmup_plan_errors(num_rows: int, width: int, message: str) -> None:
    with pytest.raises(GeometryError, match=message):
        padding_plan(num_rows, width, table=SlotTable(4, 8, SINK))


def test_state_slots_follow_their_rows_and_padding_takes_the_sink_state() -> None:
    """A hybrid's rows carry their sequences' state slots; padded rows the sink state slot."""
    with_state = [
        dataclasses.replace(s, state_slot=slot) for s, slot in zip(seqs(), (2, 0), strict=True)
    ]
    plan = plan_decode(with_state, sink_slot=SINK, sink_state_slot=3)
    assert (plan.state_slots.tolist(), plan.sink_state_slot) == ([2, 0], 3)
    padded = pad_decode(plan, 4, 8)
    assert padded.state_slots.tolist() == [2, 0, 3, 3]
    table = SlotTable(4, 8, SINK)
    assert padding_plan(3, 4, table=table, sink_state_slot=5).state_slots.tolist() == [5, 5, 5]
