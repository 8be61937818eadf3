"""BlockAllocator, check_conservation and BlockTable: exact ids, ref counts, slots, errors."""

from __future__ import annotations

from collections import deque

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nanoserve.core import (
    BlockAllocator,
    BlockTable,
    ConservationError,
    GeometryError,
    OutOfBlocksError,
    check_conservation,
)

# --- BlockAllocator ---------------------------------------------------------------------------


def test_fresh_allocator_is_all_free() -> None:
    allocator = BlockAllocator(4)
    assert (allocator.num_blocks, allocator.num_free, allocator.num_used) == (4, 4, 0)
    assert [allocator.ref_count(b) for b in range(4)] == [0, 0, 0, 0]
    check_conservation(allocator)


def test_allocate_hands_out_lowest_ids_in_order() -> None:
    allocator = BlockAllocator(5)
    assert allocator.allocate(2) == [0, 1]
    assert allocator.allocate() == [2]
    assert (allocator.num_free, allocator.num_used) == (2, 3)
    assert [allocator.ref_count(b) for b in range(5)] == [1, 1, 1, 0, 0]


def test_freed_blocks_rejoin_the_back_of_the_free_queue() -> None:
    allocator = BlockAllocator(5)
    assert allocator.allocate(3) == [0, 1, 2]
    allocator.free([1])
    allocator.free([0])
    # Never-used blocks 3 and 4 come first, then the freed ones in the order they were freed.
    assert allocator.allocate(4) == [3, 4, 1, 0]
    assert (allocator.num_free, allocator.num_used) == (0, 5)


def test_allocate_zero_returns_nothing() -> None:
    allocator = BlockAllocator(2)
    assert allocator.allocate(0) == []
    assert allocator.num_free == 2


def test_can_allocate_bounds() -> None:
    allocator = BlockAllocator(4)
    allocator.allocate(1)
    assert [allocator.can_allocate(n) for n in (-1, 0, 1, 3, 4)] == [False, True, True, True, False]


def test_out_of_blocks_quotes_numbers_and_changes_nothing() -> None:
    allocator = BlockAllocator(4)
    allocator.allocate(3)
    with pytest.raises(OutOfBlocksError, match=r"^cannot get 2 free blocks: 1 of 4 free$"):
        allocator.allocate(2)
    assert (allocator.num_free, allocator.num_used) == (1, 3)
    assert allocator.allocate(1) == [3]


def test_negative_allocate_is_a_geometry_error() -> None:
    with pytest.raises(GeometryError, match=r"cannot allocate -1 blocks"):
        BlockAllocator(4).allocate(-1)


@pytest.mark.parametrize("num_blocks", [0, -3])
def test_allocator_needs_a_positive_size(num_blocks: int) -> None:
    with pytest.raises(
        GeometryError, match=rf"num_blocks must be a positive integer, got {num_blocks}"
    ):
        BlockAllocator(num_blocks)


def test_fork_adds_a_reference_and_free_drops_one() -> None:
    allocator = BlockAllocator(3)
    assert allocator.allocate(2) == [0, 1]
    assert allocator.fork(1) == 1
    assert allocator.fork(1) == 1
    assert allocator.ref_count(1) == 3
    allocator.free([1])
    assert (allocator.ref_count(1), allocator.num_free) == (2, 1)
    allocator.free([1, 1])
    assert (allocator.ref_count(1), allocator.num_free) == (0, 2)
    # Block 1 returned only when its last reference went: it is next after block 2.
    assert allocator.allocate(2) == [2, 1]
    check_conservation(allocator)


def test_free_of_a_free_block_is_a_conservation_error() -> None:
    allocator = BlockAllocator(4)
    allocator.allocate(1)
    allocator.free([0])
    with pytest.raises(ConservationError, match=r"^cannot free block 0: it is free$"):
        allocator.free([0])
    with pytest.raises(ConservationError, match=r"^cannot free block 3: it is free$"):
        allocator.free([3])


def test_fork_of_a_free_block_is_a_conservation_error() -> None:
    with pytest.raises(ConservationError, match=r"^cannot fork block 2: it is free$"):
        BlockAllocator(4).fork(2)


@pytest.mark.parametrize("block", [-1, 4])
def test_block_ids_outside_the_pool_are_geometry_errors(block: int) -> None:
    allocator = BlockAllocator(4)
    allocator.allocate(4)
    message = rf"^block {block} is outside 0\.\.3$"
    with pytest.raises(GeometryError, match=message):
        allocator.free([block])
    with pytest.raises(GeometryError, match=message):
        allocator.fork(block)
    with pytest.raises(GeometryError, match=message):
        allocator.ref_count(block)


# --- check_conservation: the gate itself, on allocators corrupted behind the API's back --------


def test_conservation_fails_on_a_duplicate_free_entry() -> None:
    allocator = BlockAllocator(4)
    allocator._free.append(0)
    with pytest.raises(
        ConservationError, match=r"^free list holds 5 entries but 4 distinct blocks$"
    ):
        check_conservation(allocator)


def test_conservation_fails_on_a_block_both_free_and_used() -> None:
    allocator = BlockAllocator(4)
    assert allocator.allocate(2) == [0, 1]
    allocator._free.append(1)
    with pytest.raises(ConservationError, match=r"^blocks \[1\] are both free and used$"):
        check_conservation(allocator)


def test_conservation_fails_on_a_leaked_block() -> None:
    allocator = BlockAllocator(4)
    assert allocator.allocate(1) == [0]
    allocator._refs[0] = 0  # neither referenced nor on the free list
    with pytest.raises(ConservationError, match=r"^free 3 \+ used 0 != total 4$"):
        check_conservation(allocator)


# --- Hypothesis: any sequence of allocate / free / fork keeps the books ------------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["allocate", "free", "fork"]), st.integers(0, 6)), max_size=60
)


@settings(max_examples=150, deadline=None)
@given(num_blocks=st.integers(1, 8), ops=OPS)
def test_random_sequences_keep_conservation_and_ref_counts(
    num_blocks: int, ops: list[tuple[str, int]]
) -> None:
    allocator = BlockAllocator(num_blocks)
    free_model: deque[int] = deque(range(num_blocks))
    refs_model = [0] * num_blocks
    for op, arg in ops:
        used = [b for b in range(num_blocks) if refs_model[b] > 0]
        if op == "allocate":
            if arg > len(free_model):
                with pytest.raises(OutOfBlocksError):
                    allocator.allocate(arg)
            else:
                expected = [free_model.popleft() for _ in range(arg)]
                assert allocator.allocate(arg) == expected
                for block in expected:
                    refs_model[block] = 1
        elif op == "fork" and used:
            block = used[arg % len(used)]
            assert allocator.fork(block) == block
            refs_model[block] += 1
        elif op == "free" and used:
            block = used[arg % len(used)]
            allocator.free([block])
            refs_model[block] -= 1
            if refs_model[block] == 0:
                free_model.append(block)
        check_conservation(allocator)
        assert [allocator.ref_count(b) for b in range(num_blocks)] == refs_model
        assert allocator.num_free == len(free_model)
        assert allocator.num_free + allocator.num_used == num_blocks
    # Whatever is still free comes out in the model's order.
    assert allocator.allocate(len(free_model)) == list(free_model)


# --- BlockTable -------------------------------------------------------------------------------


def test_block_table_slots_follow_the_block_order() -> None:
    table = BlockTable(4, [3, 0])
    assert table.capacity == 8
    assert [table.slot(p) for p in range(8)] == [12, 13, 14, 15, 0, 1, 2, 3]
    assert table.slot(5) == 1


def test_block_table_slot_ids_exact() -> None:
    table = BlockTable(4, [3, 0])
    ids = table.slot_ids(6)
    assert ids.dtype == torch.int64
    assert ids.tolist() == [12, 13, 14, 15, 0, 1]
    assert table.slot_ids(8).tolist() == [12, 13, 14, 15, 0, 1, 2, 3]
    assert table.slot_ids(0).tolist() == []
    assert BlockTable(4).slot_ids(0).tolist() == []


@pytest.mark.parametrize("position", [-1, 8])
def test_block_table_slot_outside_capacity(position: int) -> None:
    with pytest.raises(
        GeometryError, match=rf"^position {position} is outside this table's 8 slots$"
    ):
        BlockTable(4, [3, 0]).slot(position)


@pytest.mark.parametrize("num_tokens", [-1, 9])
def test_block_table_slot_ids_outside_capacity(num_tokens: int) -> None:
    with pytest.raises(
        GeometryError, match=rf"^{num_tokens} tokens do not fit this table's 8 slots$"
    ):
        BlockTable(4, [3, 0]).slot_ids(num_tokens)


@pytest.mark.parametrize(
    ("blocks", "num_tokens", "needed"),
    [
        ([3, 0], 0, 0),
        ([3, 0], 8, 0),
        ([3, 0], 9, 1),
        ([3, 0], 13, 2),
        ([], 1, 1),
        ([], 4, 1),
        ([], 5, 2),
        ([7], 3, 0),
    ],
)
def test_blocks_needed(blocks: list[int], num_tokens: int, needed: int) -> None:
    assert BlockTable(4, blocks).blocks_needed(num_tokens) == needed


def test_block_table_needs_a_positive_block_size() -> None:
    with pytest.raises(GeometryError, match=r"block_size must be a positive integer, got 0"):
        BlockTable(0)


def test_block_table_copies_its_blocks() -> None:
    blocks = [2, 1]
    table = BlockTable(4, blocks)
    blocks.append(0)
    assert table.blocks == [2, 1]


@settings(max_examples=100, deadline=None)
@given(
    block_size=st.integers(1, 6),
    blocks=st.lists(st.integers(0, 20), min_size=1, max_size=6, unique=True),
    data=st.data(),
)
def test_slot_ids_agree_with_slot(block_size: int, blocks: list[int], data: st.DataObject) -> None:
    table = BlockTable(block_size, blocks)
    num_tokens = data.draw(st.integers(0, table.capacity))
    ids = table.slot_ids(num_tokens).tolist()
    assert ids == [table.slot(p) for p in range(num_tokens)]
    assert len(set(ids)) == num_tokens  # distinct blocks give distinct slots
    assert all(ids[p] // block_size == blocks[p // block_size] for p in range(num_tokens))
    assert table.blocks_needed(num_tokens) == 0
    assert table.blocks_needed(table.capacity + 1) == 1
