"""Capture gates: each passes on a bucketed table-window plan and on a warm plan (vacuously),
and fails with its own named error on a plan built the wrong way."""

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
    SlotTable,
    bucket_decode,
    pad_decode,
    padding_plan,
    plan_decode,
)
from nanoserve.core.capture_gates import (
    AddressesMovedError,
    MappingNotWindowError,
    PadNotInertError,
    PlanAddressingError,
    PoolBudgetExceededError,
    ReplayRowsError,
    WindowNotIntactError,
    check_addresses_stable,
    check_mapping_is_window,
    check_pad_inert,
    check_plan_addressing,
    check_pool_budget,
    check_replay_rows,
    check_window_intact,
)

SINK = 16
BUCKETS = BucketSet(4, 8, 4)


def vec(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


@pytest.fixture
def table() -> SlotTable:
    return SlotTable(4, 8, SINK)


@pytest.fixture
def plan(table: SlotTable) -> DecodePlan:
    """Three sequences bucketed to (4, 8) as a window on the table; row 3 is padding."""
    seqs = [
        DecodeSeq(10, 100, 5, BlockTable(4, [3, 0])),  # writes slot 1
        DecodeSeq(11, 101, 2, BlockTable(4, [1])),  # writes slot 6
        DecodeSeq(12, 102, 0, BlockTable(4, [2])),  # writes slot 8
    ]
    bucketed = bucket_decode(plan_decode(seqs, sink_slot=SINK, table=table), BUCKETS, table)
    assert (bucketed.seq_ids, bucketed.pad_rows, bucketed.shape) == ((10, 11, 12), 1, (4, 8))
    assert bucketed.write_slots.tolist() == [1, 6, 8, SINK]
    assert bucketed.context_lens.tolist() == [6, 3, 1, 0]
    return bucketed


@pytest.fixture
def warm(table: SlotTable, plan: DecodePlan) -> DecodePlan:
    """A warm plan over the same table, which holds the real rows above."""
    return padding_plan(4, 8, table=table)


def test_every_gate_error_is_a_gate_error() -> None:
    for error in (
        PadNotInertError,
        MappingNotWindowError,
        WindowNotIntactError,
        PlanAddressingError,
        ReplayRowsError,
        AddressesMovedError,
        PoolBudgetExceededError,
    ):
        assert issubclass(error, GateError)


# --- every precondition passes on a correct plan, and vacuously on a warm plan -----------------


def test_all_preconditions_pass_on_a_bucketed_window_plan(
    plan: DecodePlan, table: SlotTable
) -> None:
    check_pad_inert(plan)
    check_mapping_is_window(plan, table)
    check_window_intact(plan, table)
    check_plan_addressing(plan)
    check_replay_rows(plan.seq_ids, plan)


def test_all_preconditions_pass_vacuously_on_a_warm_plan(
    warm: DecodePlan, table: SlotTable
) -> None:
    assert warm.seq_ids == ()
    check_pad_inert(warm)
    check_mapping_is_window(warm, table)
    check_window_intact(warm, table)
    check_plan_addressing(warm)
    check_replay_rows((), warm)


# --- check_pad_inert ---------------------------------------------------------------------------


def test_pad_inert_fails_on_a_padded_row_pointing_at_a_real_slot(plan: DecodePlan) -> None:
    wrong = replace(plan, write_slots=vec(1, 6, 8, 5))
    with pytest.raises(
        PadNotInertError,
        match=r"^padded row 3 has context_len 0 and write slot 5; padding needs 0 and the sink 16$",
    ):
        check_pad_inert(wrong)


def test_pad_inert_fails_on_an_unmasked_padded_row(plan: DecodePlan) -> None:
    wrong = replace(plan, context_lens=vec(6, 3, 1, 2))
    with pytest.raises(
        PadNotInertError, match=r"^padded row 3 has context_len 2 and write slot 16"
    ):
        check_pad_inert(wrong)


def test_pad_inert_fails_on_a_padded_row_using_a_real_state_slot(plan: DecodePlan) -> None:
    """A hybrid's padded row must read and write only the sink state slot."""
    wrong = replace(plan, state_slots=vec(0, 1, 2, 2), sink_state_slot=3)
    with pytest.raises(
        PadNotInertError,
        match=r"^padded row 3 uses state slot 2; padding needs the sink state slot 3$",
    ):
        check_pad_inert(wrong)


def test_pad_inert_fails_on_a_real_row_writing_the_sink(plan: DecodePlan) -> None:
    wrong = replace(plan, write_slots=vec(1, SINK, 8, SINK))
    with pytest.raises(PadNotInertError, match=r"^real row 1 \(sequence 11\) writes to the sink$"):
        check_pad_inert(wrong)


def test_pad_inert_fails_on_a_warm_plan_whose_rows_are_not_empty(
    plan: DecodePlan, table: SlotTable
) -> None:
    # Built the wrong way: padding a real plan, then making every row look like padding.
    wrong = replace(
        pad_decode(plan, 4, 8, table), write_slots=vec(*[SINK] * 4), context_lens=vec(0, 0, 0, 0)
    )
    assert wrong.seq_ids == (10, 11, 12)
    with pytest.raises(PadNotInertError, match=r"^real row 0 \(sequence 10\) writes to the sink$"):
        check_pad_inert(wrong)


def test_pad_inert_fails_on_a_warm_plan_writing_a_real_slot(warm: DecodePlan) -> None:
    with pytest.raises(PadNotInertError, match=r"^padded row 2 has context_len 0 and write slot 8"):
        check_pad_inert(replace(warm, write_slots=vec(SINK, SINK, 8, SINK)))


# --- check_mapping_is_window -------------------------------------------------------------------


def test_mapping_fails_on_a_copied_rectangle(plan: DecodePlan, table: SlotTable) -> None:
    copy = replace(plan, slot_rect=plan.slot_rect.clone())
    assert torch.equal(copy.slot_rect, plan.slot_rect)  # same numbers, wrong storage
    with pytest.raises(MappingNotWindowError, match=r"^the \(4, 8\) rectangle at 0x[0-9a-f]+"):
        check_mapping_is_window(copy, table)


def test_mapping_fails_on_a_plan_padded_without_the_table(
    plan: DecodePlan, table: SlotTable
) -> None:
    off_table = pad_decode(plan, 4, 8)  # no table: a fresh sink-padded tensor
    with pytest.raises(MappingNotWindowError, match=r"is not a window on the table"):
        check_mapping_is_window(off_table, table)


def test_mapping_fails_on_a_window_off_the_tables_origin(
    plan: DecodePlan, table: SlotTable
) -> None:
    shifted = replace(plan, slot_rect=table.tensor[0:4, 1:])
    with pytest.raises(MappingNotWindowError, match=r"is not a window on the table"):
        check_mapping_is_window(shifted, table)


def test_mapping_fails_on_a_transposed_view() -> None:
    square = SlotTable(4, 4, SINK)
    warm = padding_plan(4, 4, table=square)
    transposed = replace(warm, slot_rect=square.tensor.t())
    assert transposed.slot_rect.data_ptr() == square.address
    with pytest.raises(MappingNotWindowError, match=r"\(strides \(1, 4\)\)"):
        check_mapping_is_window(transposed, square)


def test_mapping_fails_on_a_moved_table(plan: DecodePlan, table: SlotTable) -> None:
    with pytest.raises(MappingNotWindowError, match=r"is not a window on the table"):
        check_mapping_is_window(plan, table.to("cpu"))


def test_mapping_fails_on_rows_not_the_tables_prefix(plan: DecodePlan, table: SlotTable) -> None:
    with pytest.raises(
        MappingNotWindowError,
        match=r"^plan rows \(11, 10, 12\) are not a prefix of table rows \(10, 11, 12\)$",
    ):
        check_mapping_is_window(replace(plan, seq_ids=(11, 10, 12)), table)


def test_mapping_fails_on_a_warm_plan_with_a_copied_rectangle(
    warm: DecodePlan, table: SlotTable
) -> None:
    with pytest.raises(MappingNotWindowError, match=r"is not a window on the table"):
        check_mapping_is_window(replace(warm, slot_rect=warm.slot_rect.clone()), table)


# --- check_window_intact -----------------------------------------------------------------------


def test_window_fails_on_a_row_owned_by_another_sequence(
    plan: DecodePlan, table: SlotTable
) -> None:
    table.write_row(1, 99, vec(4, 5, 6))
    with pytest.raises(
        WindowNotIntactError,
        match=r"^row 1: the table holds 3 positions of sequence 99; the plan needs 3 of sequence 11$",
    ):
        check_window_intact(plan, table)


def test_window_fails_on_a_released_row(plan: DecodePlan, table: SlotTable) -> None:
    table.release(12)
    with pytest.raises(
        WindowNotIntactError,
        match=r"^row 2: the table holds 0 positions of sequence None; the plan needs 1 of sequence 12$",
    ):
        check_window_intact(plan, table)


def test_window_fails_on_a_row_not_written_far_enough(plan: DecodePlan, table: SlotTable) -> None:
    table.write_row(0, 10, vec(12, 13, 14, 15))  # same owner, now only 4 positions written
    with pytest.raises(
        WindowNotIntactError,
        match=r"^row 0: the table holds 4 positions of sequence 10; the plan needs 6 of sequence 10$",
    ):
        check_window_intact(plan, table)


def test_window_fails_on_a_plan_larger_than_the_table(plan: DecodePlan) -> None:
    small = SlotTable(2, 8, SINK)
    with pytest.raises(
        WindowNotIntactError, match=r"^a \(4, 8\) window does not fit the 2x8 table$"
    ):
        check_window_intact(plan, small)


# --- check_plan_addressing ---------------------------------------------------------------------


def test_addressing_fails_on_a_write_slot_disagreeing_with_the_rectangle(
    plan: DecodePlan,
) -> None:
    wrong = replace(plan, write_slots=vec(2, 6, 8, SINK))
    with pytest.raises(
        PlanAddressingError,
        match=(
            r"^row 0 \(sequence 10\) writes slot 2 but its rectangle addresses position 5"
            r" at slot 1$"
        ),
    ):
        check_plan_addressing(wrong)


def test_addressing_fails_on_a_position_not_context_minus_one(plan: DecodePlan) -> None:
    wrong = replace(plan, positions=vec(5, 3, 0, 0))
    with pytest.raises(
        PlanAddressingError,
        match=r"^row 1 \(sequence 11\): position 3, context_len 3, width 8$",
    ):
        check_plan_addressing(wrong)


def test_addressing_fails_on_a_context_wider_than_the_rectangle(plan: DecodePlan) -> None:
    wrong = replace(plan, positions=vec(8, 2, 0, 0), context_lens=vec(9, 3, 1, 0))
    with pytest.raises(
        PlanAddressingError, match=r"^row 0 \(sequence 10\): position 8, context_len 9"
    ):
        check_plan_addressing(wrong)


def test_addressing_fails_on_an_empty_real_row(plan: DecodePlan) -> None:
    wrong = replace(plan, context_lens=vec(6, 3, 0, 0))
    with pytest.raises(
        PlanAddressingError, match=r"^row 2 \(sequence 12\): position 0, context_len 0"
    ):
        check_plan_addressing(wrong)


def test_addressing_fails_when_both_write_and_rectangle_name_the_sink(
    plan: DecodePlan, table: SlotTable
) -> None:
    # Row 2's position 0 made to name the sink in the table, and its write to match it.
    table.tensor[2, 0] = SINK
    wrong = replace(plan, write_slots=vec(1, 6, SINK, SINK))
    with pytest.raises(PlanAddressingError, match=r"^row 2 \(sequence 12\) writes slot 16"):
        check_plan_addressing(wrong)


# --- check_replay_rows -------------------------------------------------------------------------


def test_replay_over_the_frozen_rows_passes(plan: DecodePlan) -> None:
    check_replay_rows((10, 11, 12), plan)


def test_replay_of_an_unbound_recording_passes_over_any_rows(
    plan: DecodePlan, warm: DecodePlan
) -> None:
    check_replay_rows((), plan)
    check_replay_rows((), warm)


def test_replay_over_a_different_row_set_fails(plan: DecodePlan) -> None:
    with pytest.raises(
        ReplayRowsError,
        match=r"^the recording froze rows \(10, 11, 13\); this step's rows are \(10, 11, 12\)$",
    ):
        check_replay_rows((10, 11, 13), plan)
    with pytest.raises(ReplayRowsError, match=r"froze rows \(11, 10, 12\)"):
        check_replay_rows((11, 10, 12), plan)


def test_replay_of_a_bound_recording_over_a_warm_plan_fails(warm: DecodePlan) -> None:
    with pytest.raises(ReplayRowsError, match=r"this step's rows are \(\)$"):
        check_replay_rows((10, 11, 12), warm)


# --- check_addresses_stable --------------------------------------------------------------------


def test_addresses_stable_across_loads(plan: DecodePlan, warm: DecodePlan) -> None:
    buffers = DecodeBuffers.allocate(4, SINK)
    recorded = buffers.addresses()
    buffers.load(warm)
    buffers.load(plan)
    check_addresses_stable(recorded, buffers.addresses())


def test_addresses_fail_on_a_reallocated_buffer() -> None:
    buffers = DecodeBuffers.allocate(4, SINK)
    recorded = buffers.addresses()
    moved = replace(buffers, context_lens=buffers.context_lens.clone())
    now = moved.context_lens.data_ptr()
    with pytest.raises(
        AddressesMovedError,
        match=rf"^context_lens was at {recorded['context_lens']:#x} when recorded, now {now:#x}$",
    ):
        check_addresses_stable(recorded, moved.addresses())


def test_addresses_fail_on_a_missing_buffer() -> None:
    recorded = DecodeBuffers.allocate(4, SINK).addresses()
    current = {k: v for k, v in recorded.items() if k != "positions"}
    with pytest.raises(
        AddressesMovedError, match=r"^positions was at 0x[0-9a-f]+ when recorded, now gone$"
    ):
        check_addresses_stable(recorded, current)


# --- check_pool_budget -------------------------------------------------------------------------


def test_pool_budget() -> None:
    check_pool_budget(100, 100)
    check_pool_budget(0, 0)
    with pytest.raises(
        PoolBudgetExceededError, match=r"^recording needs 101 bytes; the budget leaves 100$"
    ):
        check_pool_budget(101, 100)
