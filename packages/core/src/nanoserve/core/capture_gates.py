"""Gates that prove a decode step is safe to record, and a recording safe to replay.

A recording keeps its argument objects forever. It computes real steps only if every argument
is a window on storage that real steps write through, padded rows touch nothing, and nothing
it holds has moved. Each gate checks one of those facts; on a warm plan (no real rows) the
real-row clauses pass vacuously.
"""

from __future__ import annotations

from collections.abc import Mapping

from nanoserve.core.decode_plan import DecodePlan
from nanoserve.core.errors import GateError
from nanoserve.core.slot_table import SlotTable


class PadNotInertError(GateError):
    """A padded row is not masked or does not write the sinks (K/V and state), or a real row
    writes the K/V sink."""


class MappingNotWindowError(GateError):
    """The plan's rectangle is not a view on the slot table, or its rows are not the table's."""


class WindowNotIntactError(GateError):
    """A real row's addresses in the table are not its sequence's, or not written far enough."""


class PlanAddressingError(GateError):
    """A real row's position, write slot and context length disagree."""


class ReplayRowsError(GateError):
    """A recording bound to one row set was asked to replay over another."""


class AddressesMovedError(GateError):
    """A buffer a recording holds was reallocated after the recording."""


class PoolBudgetExceededError(GateError):
    """A recording would need more memory than the budget leaves."""


def check_pad_inert(plan: DecodePlan) -> None:
    real = len(plan.seq_ids)
    lens = plan.context_lens.tolist()
    writes = plan.write_slots.tolist()
    states = plan.state_slots.tolist()
    for row in range(real, plan.num_rows):
        if lens[row] != 0 or writes[row] != plan.sink_slot:
            raise PadNotInertError(
                f"padded row {row} has context_len {lens[row]} and write slot {writes[row]};"
                f" padding needs 0 and the sink {plan.sink_slot}"
            )
        if states[row] != plan.sink_state_slot:
            raise PadNotInertError(
                f"padded row {row} uses state slot {states[row]}; padding needs the sink state"
                f" slot {plan.sink_state_slot}"
            )
    for row in range(real):
        if writes[row] == plan.sink_slot:
            raise PadNotInertError(
                f"real row {row} (sequence {plan.seq_ids[row]}) writes to the sink"
            )


def check_mapping_is_window(plan: DecodePlan, table: SlotTable) -> None:
    owners = table.row_owners[: len(plan.seq_ids)]
    if owners != plan.seq_ids:
        raise MappingNotWindowError(
            f"plan rows {plan.seq_ids} are not a prefix of table rows {owners}"
        )
    rect = plan.slot_rect
    same_storage = rect.untyped_storage().data_ptr() == table.tensor.untyped_storage().data_ptr()
    if (
        not same_storage
        or rect.data_ptr() != table.address
        or rect.stride() != table.tensor.stride()
    ):
        raise MappingNotWindowError(
            f"the {tuple(rect.shape)} rectangle at {rect.data_ptr():#x} (strides {rect.stride()})"
            f" is not a window on the table at {table.address:#x} (strides {table.tensor.stride()})"
        )


def check_window_intact(plan: DecodePlan, table: SlotTable) -> None:
    if plan.num_rows > table.max_batch or plan.width > table.max_model_len:
        raise WindowNotIntactError(
            f"a {plan.shape} window does not fit the {table.max_batch}x{table.max_model_len} table"
        )
    lens = plan.context_lens.tolist()
    for row, seq_id in enumerate(plan.seq_ids):
        if table.owner(row) != seq_id or table.written_len(row) < lens[row]:
            raise WindowNotIntactError(
                f"row {row}: the table holds {table.written_len(row)} positions of sequence"
                f" {table.owner(row)}; the plan needs {lens[row]} of sequence {seq_id}"
            )


def check_plan_addressing(plan: DecodePlan) -> None:
    lens = plan.context_lens.tolist()
    positions = plan.positions.tolist()
    writes = plan.write_slots.tolist()
    for row, seq_id in enumerate(plan.seq_ids):
        if not 0 < lens[row] <= plan.width or positions[row] != lens[row] - 1:
            raise PlanAddressingError(
                f"row {row} (sequence {seq_id}): position {positions[row]}, context_len"
                f" {lens[row]}, width {plan.width}"
            )
        addressed = int(plan.slot_rect[row, positions[row]])
        if writes[row] != addressed or writes[row] >= plan.sink_slot:
            raise PlanAddressingError(
                f"row {row} (sequence {seq_id}) writes slot {writes[row]} but its rectangle"
                f" addresses position {positions[row]} at slot {addressed}"
            )


def check_replay_rows(recorded_rows: tuple[int, ...], plan: DecodePlan) -> None:
    """A recording over the empty row set is unbound and replays over any rows."""
    if recorded_rows and recorded_rows != plan.seq_ids:
        raise ReplayRowsError(
            f"the recording froze rows {recorded_rows}; this step's rows are {plan.seq_ids}"
        )


def check_addresses_stable(recorded: Mapping[str, int], current: Mapping[str, int]) -> None:
    for name, address in recorded.items():
        now = current.get(name)
        if now != address:
            now_text = "gone" if now is None else f"{now:#x}"
            raise AddressesMovedError(f"{name} was at {address:#x} when recorded, now {now_text}")


def check_pool_budget(needed_bytes: int, budget_bytes: int) -> None:
    if needed_bytes > budget_bytes:
        raise PoolBudgetExceededError(
            f"recording needs {needed_bytes} bytes; the budget leaves {budget_bytes}"
        )
