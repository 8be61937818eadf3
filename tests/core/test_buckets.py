"""BucketSet and bucket_decode: the exact closed shape set, and padding to its smallest member."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.core import (
    BlockTable,
    BucketSet,
    DecodeSeq,
    GeometryError,
    Shape,
    SlotTable,
    bucket_decode,
    plan_decode,
)

SINK = 96  # 24 blocks of 4 slots: enough for six sequences of 16 positions


@pytest.mark.parametrize(
    ("max_batch", "rows"),
    [
        (1, (1,)),
        (2, (1, 2)),
        (4, (1, 2, 4)),
        (6, (1, 2, 4, 6)),
        (8, (1, 2, 4, 8)),
        (9, (1, 2, 4, 8, 9)),
    ],
)
def test_row_buckets(max_batch: int, rows: tuple[int, ...]) -> None:
    assert BucketSet(max_batch, 64, 32).row_buckets == rows


@pytest.mark.parametrize(
    ("max_model_len", "multiple", "widths"),
    [
        (100, 32, (32, 64, 96, 100)),
        (96, 32, (32, 64, 96)),
        (10, 32, (10,)),
        (1, 1, (1,)),
        (5, 2, (2, 4, 5)),
    ],
)
def test_width_buckets(max_model_len: int, multiple: int, widths: tuple[int, ...]) -> None:
    assert BucketSet(4, max_model_len, multiple).width_buckets == widths


def test_serving_size_is_nine_by_sixty_four() -> None:
    buckets = BucketSet(256, 8192, 128)
    assert buckets.row_buckets == (1, 2, 4, 8, 16, 32, 64, 128, 256)
    widths = buckets.width_buckets
    assert len(widths) == 64
    assert widths == tuple(range(128, 8193, 128))
    assert len(buckets.shapes) == 576 == 9 * 64
    assert len(set(buckets.shapes)) == 576
    assert buckets.shapes[0] == Shape(1, 128)
    assert buckets.shapes[-1] == Shape(256, 8192)


def test_shapes_are_row_major() -> None:
    assert BucketSet(2, 5, 2).shapes == (
        Shape(1, 2),
        Shape(1, 4),
        Shape(1, 5),
        Shape(2, 2),
        Shape(2, 4),
        Shape(2, 5),
    )


@pytest.mark.parametrize(("num_rows", "bucket"), [(1, 1), (2, 2), (3, 4), (4, 4), (5, 6), (6, 6)])
def test_row_bucket(num_rows: int, bucket: int) -> None:
    assert BucketSet(6, 100, 32).row_bucket(num_rows) == bucket


@pytest.mark.parametrize(
    ("width", "bucket"), [(1, 32), (32, 32), (33, 64), (96, 96), (97, 100), (100, 100)]
)
def test_width_bucket(width: int, bucket: int) -> None:
    assert BucketSet(6, 100, 32).width_bucket(width) == bucket


def test_bucket_of() -> None:
    assert BucketSet(6, 100, 32).bucket_of(3, 40) == Shape(4, 64)


@pytest.mark.parametrize("num_rows", [0, -1, 7])
def test_row_bucket_out_of_range(num_rows: int) -> None:
    with pytest.raises(GeometryError, match=rf"^{num_rows} rows is outside 1\.\.max_batch 6$"):
        BucketSet(6, 100, 32).row_bucket(num_rows)


@pytest.mark.parametrize("width", [0, 101])
def test_width_bucket_out_of_range(width: int) -> None:
    with pytest.raises(GeometryError, match=rf"^width {width} is outside 1\.\.max_model_len 100$"):
        BucketSet(6, 100, 32).width_bucket(width)


@pytest.mark.parametrize("field", ["max_batch", "max_model_len", "width_multiple"])
def test_bucket_set_needs_positive_sizes(field: str) -> None:
    args = {"max_batch": 6, "max_model_len": 100, "width_multiple": 32, field: 0}
    with pytest.raises(GeometryError, match=rf"^{field} must be a positive integer, got 0$"):
        BucketSet(**args)


def three_seqs() -> list[DecodeSeq]:
    return [
        DecodeSeq(10, 100, 5, BlockTable(4, [3, 0])),
        DecodeSeq(11, 101, 2, BlockTable(4, [1])),
        DecodeSeq(12, 102, 0, BlockTable(4, [2])),
    ]


def test_bucket_decode_pads_to_the_smallest_bucket() -> None:
    S = SINK
    plan = plan_decode(three_seqs(), sink_slot=SINK)
    bucketed = bucket_decode(plan, BucketSet(6, 16, 4))
    assert bucketed.seq_ids == (10, 11, 12)
    assert (bucketed.pad_rows, bucketed.shape) == (1, (4, 8))
    assert bucketed.input_ids.tolist() == [100, 101, 102, 0]
    assert bucketed.positions.tolist() == [5, 2, 0, 0]
    assert bucketed.write_slots.tolist() == [1, 6, 8, S]
    assert bucketed.context_lens.tolist() == [6, 3, 1, 0]
    assert bucketed.slot_rect.tolist() == [
        [12, 13, 14, 15, 0, 1, S, S],
        [4, 5, 6, S, S, S, S, S],
        [8, S, S, S, S, S, S, S],
        [S] * 8,
    ]


def test_bucket_decode_on_a_table_is_a_window() -> None:
    table = SlotTable(6, 16, SINK)
    plan = plan_decode(three_seqs(), sink_slot=SINK, table=table)
    bucketed = bucket_decode(plan, BucketSet(6, 16, 4), table)
    assert bucketed.shape == (4, 8)
    assert bucketed.slot_rect.data_ptr() == table.address
    assert torch.equal(bucketed.slot_rect, table.tensor[:4, :8])


def test_bucket_decode_of_a_bucket_sized_plan_adds_nothing() -> None:
    plan = plan_decode(three_seqs()[:2], sink_slot=SINK)  # (2, 6)
    bucketed = bucket_decode(plan, BucketSet(6, 16, 6))
    assert (bucketed.pad_rows, bucketed.shape) == (0, (2, 6))
    assert torch.equal(bucketed.slot_rect, plan.slot_rect)


def test_bucket_decode_refuses_a_plan_wider_than_the_set() -> None:
    plan = plan_decode(three_seqs(), sink_slot=SINK)  # width 6
    with pytest.raises(GeometryError, match=r"^width 6 is outside 1\.\.max_model_len 5$"):
        bucket_decode(plan, BucketSet(6, 5, 4))


def test_bucket_decode_refuses_more_rows_than_the_set() -> None:
    plan = plan_decode(three_seqs(), sink_slot=SINK)
    with pytest.raises(GeometryError, match=r"^3 rows is outside 1\.\.max_batch 2$"):
        bucket_decode(plan, BucketSet(2, 16, 4))


# --- Hypothesis: every plan lands in the smallest bucket that holds it --------------------------


@settings(max_examples=200, deadline=None)
@given(
    max_batch=st.integers(1, 40),
    max_model_len=st.integers(1, 300),
    multiple=st.integers(1, 64),
    data=st.data(),
)
def test_bucket_of_is_the_smallest_that_fits(
    max_batch: int, max_model_len: int, multiple: int, data: st.DataObject
) -> None:
    buckets = BucketSet(max_batch, max_model_len, multiple)
    num_rows = data.draw(st.integers(1, max_batch))
    width = data.draw(st.integers(1, max_model_len))
    shape = buckets.bucket_of(num_rows, width)
    assert shape in buckets.shapes
    assert shape.rows >= num_rows and shape.width >= width
    assert not [r for r in buckets.row_buckets if num_rows <= r < shape.rows]
    assert not [w for w in buckets.width_buckets if width <= w < shape.width]
    assert shape.width % multiple == 0 or shape.width == max_model_len


@settings(max_examples=100, deadline=None)
@given(
    positions=st.lists(st.integers(0, 15), min_size=1, max_size=6),
    max_batch=st.integers(6, 9),
    multiple=st.integers(1, 8),
)
def test_every_plan_fits_its_bucket(positions: list[int], max_batch: int, multiple: int) -> None:
    # Sequence i owns blocks 4i .. 4i+3: 16 positions, all below the sink.
    seqs = [
        DecodeSeq(i, 200 + i, p, BlockTable(4, [4 * i + b for b in range(4)]))
        for i, p in enumerate(positions)
    ]
    buckets = BucketSet(max_batch, 16, multiple)
    plan = plan_decode(seqs, sink_slot=SINK)
    bucketed = bucket_decode(plan, buckets)
    shape = Shape(*bucketed.shape)
    assert shape in buckets.shapes
    assert shape == buckets.bucket_of(len(seqs), max(positions) + 1)
    assert not [r for r in buckets.row_buckets if len(seqs) <= r < shape.rows]
    assert not [w for w in buckets.width_buckets if plan.width <= w < shape.width]
    real = len(seqs)
    assert bucketed.seq_ids == plan.seq_ids and bucketed.pad_rows == shape.rows - real
    for name in ("input_ids", "positions", "write_slots", "context_lens"):
        assert torch.equal(getattr(bucketed, name)[:real], getattr(plan, name))
    assert torch.equal(bucketed.slot_rect[:real, : plan.width], plan.slot_rect)
    assert bucketed.slot_rect[:real, plan.width :].eq(SINK).all()
    assert bucketed.context_lens[real:].eq(0).all()
    assert bucketed.write_slots[real:].eq(SINK).all()
    assert bucketed.slot_rect[real:].eq(SINK).all()
