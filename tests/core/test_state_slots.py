"""State slots: one per running sequence, the sink for padding, and the gates on both."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.core.errors import GeometryError
from nanoserve.core.state_slots import (
    StateConservationError,
    StateSlotError,
    StateSlots,
    check_state_conservation,
    check_state_rows,
)


def test_take_gives_the_lowest_free_slot_and_keeps_it_per_sequence() -> None:
    slots = StateSlots(3)
    assert slots.sink == 3
    assert [slots.take(7), slots.take(9)] == [0, 1]
    assert slots.take(7) == 0  # a sequence holds one slot, asked twice
    assert (slots.num_used, slots.num_free) == (2, 1)
    slots.give_back(7)
    assert slots.slot_of(7) is None
    assert slots.take(11) == 0  # the freed one, lowest first
    slots.give_back(12345)  # a sequence that holds none: nothing happens
    check_state_conservation(slots)


def test_no_free_slot_is_a_named_error_that_quotes_the_counts() -> None:
    slots = StateSlots(1)
    slots.take(1)
    with pytest.raises(StateSlotError, match="no state slot is free for sequence 2: 1 used, 0"):
        slots.take(2)


def test_a_negative_count_is_refused() -> None:
    with pytest.raises(GeometryError, match="num_slots must be an integer >= 0, got -1"):
        StateSlots(-1)


def test_conservation_counts_checkpoints() -> None:
    slots = StateSlots(4)
    slots.take(1)
    slots.checkpoints.add(slots._free.pop())  # a saved state leaves the free list
    check_state_conservation(slots)
    slots.checkpoints.add(0)  # ... but slot 0 is sequence 1's
    with pytest.raises(StateConservationError, match=r"state slots \[0\] are used and checkpoints"):
        check_state_conservation(slots)


def test_conservation_sees_a_lost_slot() -> None:
    slots = StateSlots(4)
    slots._free.pop()  # dropped: neither free, used nor saved
    with pytest.raises(
        StateConservationError, match=r"free 3 \+ used 0 \+ checkpoints 0 != total 4"
    ):
        check_state_conservation(slots)


def test_conservation_sees_a_slot_free_twice() -> None:
    slots = StateSlots(2)
    slots._free.append(0)
    with pytest.raises(StateConservationError, match="holds 3 entries but 2 distinct slots"):
        check_state_conservation(slots)


def test_rows_pass_when_each_real_row_owns_its_slot_and_padding_uses_the_sink() -> None:
    check_state_rows([10, 11], [2, 0, 4, 4], sink=4)


@pytest.mark.parametrize(
    ("slots", "message"),
    [
        ([1, 1, 4], r"rows 0 and 1 \(sequences 10 and 11\) share state slot 1"),
        ([4, 0, 4], r"real row 0 \(sequence 10\) uses the sink 4"),
        ([0, 7, 4], r"row 1 \(sequence 11\) uses state slot 7, outside 0..4"),
        ([0, 1, 2], "padded row 2 uses state slot 2; padding needs the sink 4"),
    ],
)
def test_each_row_gate_fires_on_a_plan_built_wrong(slots: list[int], message: str) -> None:
    with pytest.raises(StateSlotError, match=message):
        check_state_rows([10, 11], slots, sink=4)


@given(st.lists(st.sampled_from(["take", "give"]), max_size=60), st.integers(1, 6))
def test_any_sequence_of_takes_and_gives_conserves_slots(ops: list[str], size: int) -> None:
    slots = StateSlots(size)
    running: list[int] = []
    next_id = 0
    for op in ops:
        if op == "take" and len(running) < size:
            slots.take(next_id)
            running.append(next_id)
            next_id += 1
        elif op == "give" and running:
            slots.give_back(running.pop(0))
        check_state_conservation(slots)
        held = [slots.slot_of(s) for s in running]
        assert len(set(held)) == len(held) and all(h is not None and h < size for h in held)
        check_state_rows(running, [h for h in held if h is not None], slots.sink)
