"""SlotTable: incremental row writes, release, windows (views) on the table, and a moved copy."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from nanoserve.core import GeometryError, SlotTable

SINK = 99


def ids(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@pytest.fixture
def table() -> SlotTable:
    return SlotTable(max_batch=3, max_model_len=8, sink_slot=SINK)


def test_fresh_table_names_only_the_sink(table: SlotTable) -> None:
    assert table.tensor.shape == (3, 8)
    assert table.tensor.dtype == torch.int64
    assert torch.equal(table.tensor, torch.full((3, 8), SINK))
    assert table.row_owners == (None, None, None)
    assert [table.written_len(r) for r in range(3)] == [0, 0, 0]
    assert table.address == table.tensor.data_ptr()
    assert table.device == torch.device("cpu")


def test_write_row_fills_positions_and_records_owner(table: SlotTable) -> None:
    table.write_row(0, 7, ids(12, 13, 14))
    assert table.tensor[0].tolist() == [12, 13, 14, SINK, SINK, SINK, SINK, SINK]
    assert (table.owner(0), table.written_len(0)) == (7, 3)
    assert table.tensor[1:].eq(SINK).all()


def test_same_owner_rewrites_only_new_positions(table: SlotTable) -> None:
    table.write_row(0, 7, ids(12, 13, 14))
    # Positions 0..2 are already written for sequence 7: only position 3 is copied.
    table.write_row(0, 7, ids(0, 0, 0, 15))
    assert table.tensor[0].tolist() == [12, 13, 14, 15, SINK, SINK, SINK, SINK]
    assert table.written_len(0) == 4


def test_owner_change_rewrites_from_zero(table: SlotTable) -> None:
    table.write_row(0, 7, ids(12, 13, 14, 15))
    table.write_row(0, 8, ids(1, 2))
    # Rewritten from position 0; positions past the new length keep what was there (masked).
    assert table.tensor[0].tolist() == [1, 2, 14, 15, SINK, SINK, SINK, SINK]
    assert (table.owner(0), table.written_len(0)) == (8, 2)


def test_same_owner_shorter_write_copies_nothing(table: SlotTable) -> None:
    table.write_row(1, 8, ids(1, 2, 3))
    table.write_row(1, 8, ids(40))
    assert table.tensor[1].tolist() == [1, 2, 3, SINK, SINK, SINK, SINK, SINK]
    assert table.written_len(1) == 1
    table.write_row(1, 8, ids(0, 0, 9))  # positions 1, 2 now count as new
    assert table.tensor[1].tolist()[:3] == [1, 0, 9]


def test_write_row_refuses_more_positions_than_the_table(table: SlotTable) -> None:
    with pytest.raises(GeometryError, match=r"^sequence 7 has 9 positions; the table holds 8$"):
        table.write_row(0, 7, torch.arange(9))
    assert table.owner(0) is None


@pytest.mark.parametrize("row", [-1, 3])
def test_rows_outside_the_table(table: SlotTable, row: int) -> None:
    message = rf"^row {row} is outside 0\.\.2$"
    with pytest.raises(GeometryError, match=message):
        table.write_row(row, 7, ids(1))
    with pytest.raises(GeometryError, match=message):
        table.owner(row)
    with pytest.raises(GeometryError, match=message):
        table.written_len(row)


def test_release_forgets_every_row_of_a_sequence(table: SlotTable) -> None:
    table.write_row(0, 7, ids(12, 13))
    table.write_row(1, 8, ids(4))
    table.write_row(2, 7, ids(5, 6))
    table.release(7)
    assert table.row_owners == (None, 8, None)
    assert [table.written_len(r) for r in range(3)] == [0, 1, 0]
    # A released row is rewritten from 0 even by the same sequence id.
    table.write_row(0, 7, ids(20, 21))
    assert table.tensor[0].tolist()[:2] == [20, 21]
    table.release(123)  # an unknown sequence is a no-op
    assert table.row_owners == (7, 8, None)


def test_read_is_a_window_on_the_table(table: SlotTable) -> None:
    table.write_row(0, 7, ids(12, 13, 14))
    table.write_row(1, 8, ids(4, 5))
    rect = table.read((7, 8), 1, 5)
    assert rect.shape == (3, 5)
    assert rect.data_ptr() == table.address
    assert rect.untyped_storage().data_ptr() == table.tensor.untyped_storage().data_ptr()
    assert rect.stride() == table.tensor.stride()
    assert rect.tolist() == [
        [12, 13, 14, SINK, SINK],
        [4, 5, SINK, SINK, SINK],
        [SINK] * 5,
    ]
    # Writes go both ways: the window sees later table writes, and writes through it land.
    table.write_row(1, 8, ids(4, 5, 6))
    assert rect[1, 2].item() == 6
    rect[2, 0] = 42
    assert table.tensor[2, 0].item() == 42


def test_read_with_no_rows_needs_padding(table: SlotTable) -> None:
    table.write_row(0, 7, ids(12))
    rect = table.read((), 2, 4)
    assert rect.shape == (2, 4)
    assert rect.data_ptr() == table.address
    assert rect[0, 0].item() == 12  # a window on the real table, not a fresh sink tensor
    with pytest.raises(GeometryError, match=r"read\(seq_ids=\(\), pad_rows=0\) addresses nothing"):
        table.read((), 0, 4)


def test_read_rows_must_be_the_tables_prefix(table: SlotTable) -> None:
    table.write_row(0, 7, ids(12))
    table.write_row(1, 8, ids(4))
    assert table.read((7,), 0, 1).shape == (1, 1)
    with pytest.raises(
        GeometryError, match=r"^sequences \(8,\) are not the table's first rows \(7,\)$"
    ):
        table.read((8,), 0, 1)
    with pytest.raises(
        GeometryError, match=r"^sequences \(8, 7\) are not the table's first rows \(7, 8\)$"
    ):
        table.read((8, 7), 0, 1)
    with pytest.raises(
        GeometryError,
        match=r"^sequences \(7, 8, 9\) are not the table's first rows \(7, 8, None\)$",
    ):
        table.read((7, 8, 9), 0, 1)


def test_read_beyond_max_batch(table: SlotTable) -> None:
    table.write_row(0, 7, ids(12))
    with pytest.raises(GeometryError, match=r"^4 rows exceed the table's max_batch 3$"):
        table.read((7,), 3, 4)
    with pytest.raises(GeometryError, match=r"^4 rows exceed the table's max_batch 3$"):
        table.read((), 4, 4)


@pytest.mark.parametrize("width", [0, -1, 9])
def test_read_width_outside_the_table(table: SlotTable, width: int) -> None:
    with pytest.raises(GeometryError, match=rf"^width {width} is outside 1\.\.8$"):
        table.read((), 1, width)


def test_read_negative_padding(table: SlotTable) -> None:
    with pytest.raises(GeometryError, match=r"^pad_rows must be >= 0, got -1$"):
        table.read((), -1, 4)


def test_to_makes_a_new_table_with_equal_content(table: SlotTable) -> None:
    table.write_row(0, 7, ids(12, 13))
    table.write_row(1, 8, ids(4))
    moved = table.to("cpu")
    assert moved is not table
    assert moved.address != table.address
    assert torch.equal(moved.tensor, table.tensor)
    assert moved.row_owners == (7, 8, None)
    assert [moved.written_len(r) for r in range(3)] == [2, 1, 0]
    assert (moved.max_batch, moved.max_model_len, moved.sink_slot) == (3, 8, SINK)
    moved.write_row(2, 9, ids(1))
    assert table.owner(2) is None
    assert table.tensor[2, 0].item() == SINK


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch": 0}, r"max_batch must be a positive integer, got 0"),
        ({"max_model_len": -4}, r"max_model_len must be a positive integer, got -4"),
        ({"sink_slot": -1}, r"sink_slot must be >= 0, got -1"),
    ],
)
def test_bad_geometry(kwargs: dict[str, int], message: str) -> None:
    args: dict[str, Any] = {"max_batch": 3, "max_model_len": 8, "sink_slot": SINK, **kwargs}
    with pytest.raises(GeometryError, match=message):
        SlotTable(**args)
