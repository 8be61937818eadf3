"""DecodeBuffers: four fixed vectors written in place; a loaded plan's vectors are views on them."""

from __future__ import annotations

import pytest
import torch

from nanoserve.core import (
    BlockTable,
    BucketSet,
    DecodeBuffers,
    DecodeSeq,
    GeometryError,
    SlotTable,
    bucket_decode,
    padding_plan,
    plan_decode,
)
from nanoserve.core.decode_buffers import BUFFER_NAMES

SINK = 16


def three_seqs(first_token: int = 100) -> list[DecodeSeq]:
    return [
        DecodeSeq(10, first_token, 5, BlockTable(4, [3, 0])),
        DecodeSeq(11, first_token + 1, 2, BlockTable(4, [1])),
        DecodeSeq(12, first_token + 2, 0, BlockTable(4, [2])),
    ]


def test_allocate_fills_padding_values() -> None:
    buffers = DecodeBuffers.allocate(5, sink_slot=SINK, sink_state_slot=8)
    assert buffers.max_batch == 5
    assert buffers.input_ids.tolist() == [0] * 5
    assert buffers.positions.tolist() == [0] * 5
    assert buffers.write_slots.tolist() == [SINK] * 5
    assert buffers.context_lens.tolist() == [0] * 5
    assert buffers.state_slots.tolist() == [8] * 5  # padding reads and writes the sink state
    assert all(getattr(buffers, name).dtype == torch.int64 for name in BUFFER_NAMES)
    assert BUFFER_NAMES == ("input_ids", "positions", "write_slots", "context_lens", "state_slots")
    assert buffers.addresses() == {name: getattr(buffers, name).data_ptr() for name in BUFFER_NAMES}
    assert len(set(buffers.addresses().values())) == 5


def test_allocate_needs_a_positive_size() -> None:
    with pytest.raises(GeometryError, match=r"^max_batch must be a positive integer, got 0$"):
        DecodeBuffers.allocate(0, sink_slot=SINK)


def test_load_writes_in_place_and_returns_views() -> None:
    buffers = DecodeBuffers.allocate(5, sink_slot=SINK)
    before = buffers.addresses()
    plan = bucket_decode(plan_decode(three_seqs(), sink_slot=SINK), BucketSet(5, 8, 4))
    loaded = buffers.load(plan)
    assert buffers.addresses() == before
    assert buffers.input_ids.tolist() == [100, 101, 102, 0, 0]
    assert buffers.positions.tolist() == [5, 2, 0, 0, 0]
    assert buffers.write_slots.tolist() == [1, 6, 8, SINK, SINK]
    assert buffers.context_lens.tolist() == [6, 3, 1, 0, 0]
    for name in BUFFER_NAMES:
        view, buffer = getattr(loaded, name), getattr(buffers, name)
        assert view.data_ptr() == buffer.data_ptr()
        assert view.untyped_storage().data_ptr() == buffer.untyped_storage().data_ptr()
        assert view.shape == (4,)
        assert torch.equal(view, getattr(plan, name))
    assert loaded.slot_rect is plan.slot_rect
    assert (loaded.seq_ids, loaded.pad_rows, loaded.sink_slot) == (plan.seq_ids, 1, SINK)


def test_a_later_load_shows_through_earlier_views() -> None:
    buffers = DecodeBuffers.allocate(4, sink_slot=SINK)
    buckets = BucketSet(4, 8, 4)
    first = buffers.load(bucket_decode(plan_decode(three_seqs(100), sink_slot=SINK), buckets))
    buffers.load(bucket_decode(plan_decode(three_seqs(200), sink_slot=SINK), buckets))
    # A recording holding the first step's views reads the second step's numbers.
    assert first.input_ids.tolist() == [200, 201, 202, 0]


def test_load_of_a_smaller_plan_leaves_the_tail() -> None:
    buffers = DecodeBuffers.allocate(4, sink_slot=SINK)
    buffers.load(plan_decode(three_seqs(), sink_slot=SINK))
    loaded = buffers.load(plan_decode(three_seqs(300)[:1], sink_slot=SINK))
    assert loaded.input_ids.tolist() == [300]
    assert buffers.input_ids.tolist() == [300, 101, 102, 0]


def test_load_of_a_warm_plan_writes_padding_into_the_real_buffers() -> None:
    buffers = DecodeBuffers.allocate(4, sink_slot=SINK)
    buffers.load(plan_decode(three_seqs(), sink_slot=SINK))
    before = buffers.addresses()
    warm = buffers.load(padding_plan(4, 8, table=SlotTable(4, 8, SINK)))
    assert buffers.addresses() == before
    assert warm.seq_ids == ()
    assert buffers.write_slots.tolist() == [SINK] * 4
    assert buffers.context_lens.tolist() == [0] * 4
    assert warm.write_slots.data_ptr() == buffers.write_slots.data_ptr()


def test_load_refuses_an_oversize_plan() -> None:
    buffers = DecodeBuffers.allocate(2, sink_slot=SINK)
    before = buffers.input_ids.clone()
    with pytest.raises(GeometryError, match=r"^a plan of 3 rows exceeds the buffers' 2$"):
        buffers.load(plan_decode(three_seqs(), sink_slot=SINK))
    assert torch.equal(buffers.input_ids, before)
