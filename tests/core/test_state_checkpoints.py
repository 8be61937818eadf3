"""Where a hybrid's states are saved for the prefix cache, and the checkpoints' own books."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nanoserve.core.errors import GeometryError
from nanoserve.core.state_checkpoints import (
    CheckpointRule,
    StateCheckpoints,
    auto_checkpoints,
)
from nanoserve.core.state_slots import StateSlotError, StateSlots, check_state_conservation

RULE = CheckpointRule(block_size=4, interval_blocks=2)  # every 8 tokens


def test_states_are_saved_every_interval_and_where_a_prompt_ends() -> None:
    # A prompt of 23 tokens: its last block boundary before the final token is 20.
    saved = [p for p in range(0, 24) if RULE.saves_at(p, 23)]
    assert saved == [8, 16, 20]
    assert RULE.prompt_end(23) == 20
    assert RULE.prompt_end(24) == 20  # token 23 is the final one: block 20..23 holds it
    assert RULE.prompt_end(25) == 24
    assert RULE.interval_tokens == 8


def test_a_prompt_shorter_than_an_interval_saves_nothing_at_its_end() -> None:
    # 7 tokens: the boundary at 4 is less than an interval (8) in: not worth a cut chunk.
    assert RULE.prompt_end(7) == 0
    assert not any(RULE.saves_at(p, 7) for p in range(8))
    assert RULE.cut(0, 7, 7) == 7
    assert RULE.prompt_end(10) == 8  # at an interval: saved as one anyway


def test_a_chunk_stops_at_the_next_saving_position() -> None:
    assert RULE.cut(0, 64, 23) == 8  # the interval
    assert RULE.cut(8, 64, 23) == 8
    assert RULE.cut(16, 64, 23) == 4  # the prompt's end, 20
    assert RULE.cut(20, 3, 23) == 3  # past every saving position: the rest
    assert RULE.cut(3, 2, 23) == 2  # a chunk that ends before one is not cut
    assert RULE.cut(5, 7, 100) == 3


@given(st.integers(0, 200), st.integers(1, 100), st.integers(1, 300))
def test_cut_chunks_land_on_every_saving_position(start: int, num_new: int, extra: int) -> None:
    """Consecutive cut chunks of a prompt visit every position where a state is saved."""
    total = start + extra
    position, visited = start, set()
    while position < total:
        position += RULE.cut(position, min(num_new, total - position), total)
        visited.add(position)
    assert {p for p in range(start + 1, total) if RULE.saves_at(p, total)} <= visited


def test_auto_is_one_per_row_within_an_eighth_of_the_budget() -> None:
    assert auto_checkpoints(32, 163_840, 1 << 30) == 32  # LFM2-1.2B: a row each
    assert auto_checkpoints(32, 20_250_624, 1 << 30) == 6  # Qwen3.5-0.8B: 128 MiB of them
    assert auto_checkpoints(32, 0, 1 << 30) == 0  # no state


def test_saving_takes_a_slot_and_the_least_recently_used_goes_past_capacity() -> None:
    slots = StateSlots(4)
    slots.take(100)  # a running sequence's
    checkpoints = StateCheckpoints(slots, 2, RULE)
    assert checkpoints.save(11) == 1
    assert checkpoints.save(11) is None  # already saved
    assert checkpoints.save(22) == 2
    assert slots.checkpoints == {1, 2}
    assert checkpoints.use(11) == 1  # 11 is now the most recently used
    assert checkpoints.save(33) == 2  # 22 dropped, its slot reused
    assert 22 not in checkpoints and 11 in checkpoints and len(checkpoints) == 2
    check_state_conservation(slots)
    checkpoints.drop(11)
    checkpoints.drop(11)  # gone already: nothing happens
    assert slots.checkpoints == {2}
    checkpoints.clear()
    assert (len(checkpoints), slots.num_free, slots.num_used) == (0, 3, 1)
    check_state_conservation(slots)


def test_no_capacity_saves_nothing() -> None:
    checkpoints = StateCheckpoints(StateSlots(2), 0, RULE)
    assert checkpoints.save(1) is None


def test_a_slot_that_holds_no_checkpoint_cannot_be_dropped() -> None:
    slots = StateSlots(2)
    with pytest.raises(StateSlotError, match="state slot 1 holds no checkpoint"):
        slots.drop(1)


def test_no_free_slot_for_a_checkpoint_is_a_named_error() -> None:
    slots = StateSlots(1)
    slots.take(5)
    with pytest.raises(StateSlotError, match="no state slot is free for a checkpoint: 1 used"):
        slots.keep()


@pytest.mark.parametrize(
    ("block_size", "interval", "message"),
    [(0, 1, "block_size must be a positive integer, got 0"), (4, 0, "interval_blocks")],
)
def test_impossible_rules_are_refused(block_size: int, interval: int, message: str) -> None:
    with pytest.raises(GeometryError, match=message):
        CheckpointRule(block_size, interval)
